"""ASGI layers in front of Django: static files, a body-size guard, and the threads a
request's sync code runs on.

Django's ASGI handler reads the whole body into a temporary file before any middleware
runs, so a size limit enforced inside Django comes after the disk is already spent.
:class:`BodySizeLimit` answers 413 in the API's error shape from the ``Content-Length``
header, and stops a chunked body the moment it passes the limit; a multipart body sent
anywhere but an upload route is 415 from its ``Content-Type``, before a byte is read.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import ThreadSensitiveContext
from django.conf import settings
from django.contrib.staticfiles import finders
from django.core.exceptions import SuspiciousFileOperation
from django.utils._os import safe_join
from starlette.responses import FileResponse, JSONResponse

from apps.core.exceptions import error_body
from apps.core.limits import body_limit, is_multipart, multipart_allowed

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
P = ParamSpec("P")
R = TypeVar("R")


class BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        content_type = headers.get("content-type", "")
        if not multipart_allowed(content_type, scope.get("path", "")):
            await _refuse(send, 415, "unsupported_media_type", _NOT_AN_UPLOAD)
            return
        if is_multipart(content_type) and not _credentials(headers):
            # An upload spools to disk before authentication runs: none without a key or
            # a session to answer for it (and, once they are checked, the team's limits).
            await _refuse(
                send, 401, "missing_api_key", _NO_CREDENTIALS, kind="authentication_error"
            )
            return
        limit, code = body_limit(content_type)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _refuse(send, 413, code, _too_large(limit))
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _refuse(send, 413, code, _too_large(limit))


_NOT_AN_UPLOAD = "A multipart body is accepted only by the document upload endpoint."


def _too_large(limit: int) -> str:
    return f"The request body is larger than the {limit}-byte limit."


_NO_CREDENTIALS = "An upload needs an API key (Authorization: Bearer) or a signed-in session."


def _credentials(headers: dict[str, str]) -> bool:
    """Whether the request names a key or a session (checked later, by the view)."""
    if headers.get("authorization", "").lower().startswith("bearer "):
        return True
    cookies = (part.strip() for part in headers.get("cookie", "").split(";"))
    return any(part.startswith(f"{settings.SESSION_COOKIE_NAME}=") for part in cookies)


async def _refuse(
    send: Send, status: int, code: str, message: str, *, kind: str = "invalid_request_error"
) -> None:
    body = json.dumps(error_body(type=kind, code=code, message=message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class StaticFiles:
    """Serves ``STATIC_URL`` from ``STATIC_ROOT`` when collected, else from the installed
    apps (Django's finders), with Starlette's file response: async, ETag, HEAD, ranges."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.prefix = "/" + settings.STATIC_URL.strip("/") + "/"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        found = self.find(path.removeprefix(self.prefix))
        headers = security_headers(secure=_is_secure(scope))
        response = (
            FileResponse(found, headers=headers)
            if found
            else JSONResponse(_NOT_FOUND, status_code=404, headers=headers)
        )
        await response(scope, receive, send)

    @staticmethod
    def find(relative: str) -> str | None:
        """The file ``relative`` names, or None for anything that is not a plain relative
        path to a file: ``..``, ``.`` or empty segments, absolute paths, backslashes and NUL
        (the server has already decoded ``%2e%2e`` and friends). Django's finders would
        raise for some of these (SuspiciousFileOperation, ValueError): a 500, not a 404."""
        if not _plain_relative(relative):
            return None
        try:
            if settings.STATIC_ROOT:
                candidate: str | None = safe_join(str(settings.STATIC_ROOT), relative)
            else:
                found = finders.find(relative)
                candidate = found if isinstance(found, str) else None
            return candidate if candidate and os.path.isfile(candidate) else None
        except (SuspiciousFileOperation, ValueError, OSError):
            return None


_NOT_FOUND = error_body(type="not_found_error", code="not_found", message="No such file.")


def security_headers(*, secure: bool) -> dict[str, str]:
    """The headers Django's security, clickjacking and CSP middleware give a page, for a
    response served outside Django: a static file is a page's script or style, and an
    HTML or SVG file there is a page of its own."""
    headers: dict[str, str] = {}
    if settings.SECURE_HSTS_SECONDS and secure:
        hsts = f"max-age={settings.SECURE_HSTS_SECONDS}"
        if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
            hsts += "; includeSubDomains"
        if settings.SECURE_HSTS_PRELOAD:
            hsts += "; preload"
        headers["Strict-Transport-Security"] = hsts
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers["X-Content-Type-Options"] = "nosniff"
    referrer = settings.SECURE_REFERRER_POLICY
    if referrer:
        values = referrer.split(",") if isinstance(referrer, str) else referrer
        headers["Referrer-Policy"] = ",".join(value.strip() for value in values)
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers["Cross-Origin-Opener-Policy"] = settings.SECURE_CROSS_ORIGIN_OPENER_POLICY
    headers["X-Frame-Options"] = getattr(settings, "X_FRAME_OPTIONS", "DENY").upper()
    if settings.CONTENT_SECURITY_POLICY:
        headers["Content-Security-Policy"] = settings.CONTENT_SECURITY_POLICY
    return headers


def _is_secure(scope: Scope) -> bool:
    """Django's ``request.is_secure()`` for a scope: the scheme, or the trusted proxy's
    header where ``SECURE_PROXY_SSL_HEADER`` names one."""
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:
        name, value = proxy
        wanted = name.removeprefix("HTTP_").replace("_", "-").lower().encode("latin-1")
        for key, given in scope.get("headers", []):
            if key.lower() == wanted:
                return bool(given.decode("latin-1").split(",")[0].strip() == value)
    return bool(scope.get("scheme") == "https")


def _plain_relative(path: str) -> bool:
    if not path or "\\" in path or "\x00" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


class LentThreads:
    """A request's thread-sensitive sync code (a sync view, Django's closing of every
    response) runs on a thread lent from a pool, not on a thread made for the request.

    Django's handler gives each request an executor of its own: a new thread at the
    request's first sync call, and another to join it at the end, for every request,
    an answer stream included (its response is closed on one): a large share of the web
    process's CPU (docs/gateway.md). The lent thread serves this
    request alone, one call at a time, as Django's would (a transaction may span calls),
    and goes back to the pool when the request ends; the pool keeps ``idle`` threads, and
    makes more while more requests run sync code at once.
    """

    def __init__(self, app: ASGIApp, *, idle: int = 16) -> None:
        self.app = app
        self.pool = _ThreadPool(idle=idle)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lent = _Lent(self.pool)
        try:
            # The outermost context decides: Django's own, inside, is then a no-op.
            async with ThreadSensitiveContext(executor=lent):
                await self.app(scope, receive, send)
        finally:
            lent.give_back()


class _ThreadPool:
    def __init__(self, *, idle: int) -> None:
        self.idle = idle
        self._free: list[ThreadPoolExecutor] = []
        self._lock = threading.Lock()

    def take(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._free:
                return self._free.pop()
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragtier-request")

    def give(self, executor: ThreadPoolExecutor) -> None:
        with self._lock:
            if len(self._free) < self.idle:
                self._free.append(executor)
                return
        executor.shutdown(wait=False)  # its thread ends on its own, joined by nobody


class _Lent(Executor):
    """One request's executor: a pooled thread, taken at its first call."""

    def __init__(self, pool: _ThreadPool) -> None:
        self.pool = pool
        self.thread: ThreadPoolExecutor | None = None
        self.last: Future[Any] | None = None

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        if self.thread is None:
            self.thread = self.pool.take()
        self.last = self.thread.submit(fn, *args, **kwargs)
        return self.last

    def give_back(self) -> None:
        """The request is over. A call still running (its caller was cancelled) keeps the
        thread until it returns; the thread then goes back."""
        thread, self.thread = self.thread, None
        if thread is None:
            return
        last = self.last
        if last is None or last.done():
            self.pool.give(thread)
        else:
            last.add_done_callback(lambda _: self.pool.give(thread))
