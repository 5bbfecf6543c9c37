"""ASGI layers in front of Django: static files, a body-size guard, and the threads a
request's sync code runs on.

Django's ASGI handler reads the whole body into a temporary file before any middleware
runs, so a size limit enforced inside Django comes after the disk is already spent.
:class:`BodySizeLimit` answers 413 in the API's error shape from the ``Content-Length``
header, and stops a chunked body the moment it passes the limit.
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
from apps.core.limits import body_limit

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
        limit, code = body_limit(headers.get("content-type", ""))
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _refuse(send, limit, code)
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
                await _refuse(send, limit, code)


async def _refuse(send: Send, limit: int, code: str) -> None:
    body = json.dumps(
        {
            "error": {
                "type": "invalid_request_error",
                "code": code,
                "message": f"The request body is larger than the {limit}-byte limit.",
                "param": None,
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
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
        headers = {"X-Content-Type-Options": "nosniff"}  # as Django's responses have
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


def _plain_relative(path: str) -> bool:
    if not path or "\\" in path or "\x00" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


class LentThreads:
    """A request's thread-sensitive sync code (a sync view, Django's closing of every
    response) runs on a thread lent from a pool, not on a thread made for the request.

    Django's handler gives each request an executor of its own: a new thread at the
    request's first sync call, and another to join it at the end, for every request,
    an answer stream included (its response is closed on one). That was 15-20% of the web
    process's CPU at 100 requests a second here (py-spy). The lent thread serves this
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

    def submit(  # type: ignore[override]
        self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Future[R]:
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
