"""Server-Sent Events framing (sse-starlette) with keep-alive pings, for Django's ASGI.

Generators here are async: under ASGI a sync iterator would be read whole before the first
byte is sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from django.http import StreamingHttpResponse
from rest_framework.renderers import BaseRenderer
from sse_starlette import ServerSentEvent

from apps.chat.services import AnswerEvent

PING_SECONDS = 15.0


class EventStreamRenderer(BaseRenderer):
    """Lets DRF's content negotiation accept ``Accept: text/event-stream``."""

    media_type = "text/event-stream"
    format = "sse"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: dict[str, Any] | None = None,
    ) -> bytes:
        return json.dumps(data).encode()


def frame(event: AnswerEvent) -> bytes:
    # Model text only ever travels inside JSON, so no text can forge an event.
    return ServerSentEvent(
        data=json.dumps(event.data, ensure_ascii=False), event=event.event, id=str(event.id)
    ).encode()


async def with_pings(
    events: AsyncIterator[AnswerEvent], every: float = PING_SECONDS
) -> AsyncIterator[bytes]:
    """Frames ``events``, with a ``: ping`` comment whenever none came for ``every`` seconds."""
    iterator = aiter(events)
    pending: asyncio.Future[AnswerEvent] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield ServerSentEvent(comment="ping").encode()
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield frame(event)
    finally:
        if pending is not None and not pending.done():
            # The client left: cancel the generation (it settles usage), and wait for it
            # to finish before closing the generator it runs in.
            pending.cancel()
            await asyncio.wait({pending})
        closer = getattr(iterator, "aclose", None)
        if closer is not None:
            await closer()


def event_stream_response(stream: AsyncIterator[bytes]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
