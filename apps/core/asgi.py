"""An ASGI guard that refuses oversized bodies before Django buffers them.

Django's ASGI handler reads the whole body into a temporary file before any middleware
runs, so a size limit enforced inside Django comes after the disk is already spent. This
guard answers 413 in the API's error shape from the ``Content-Length`` header, and stops a
chunked body the moment it passes the limit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

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
