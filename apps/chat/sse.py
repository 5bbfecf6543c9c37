"""Server-Sent Events framing (sse-starlette) with keep-alive pings, for Django's ASGI.

Generators here are async: under ASGI a sync iterator would be read whole before the first
byte is sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from django.http import StreamingHttpResponse
from rest_framework.renderers import BaseRenderer
from sse_starlette import ServerSentEvent

from apps.chat.services import AnswerEvent
from apps.core.exceptions import InvalidRequest

PING_SECONDS = 15.0
PING = ServerSentEvent(comment="ping").encode()


class EventStreamRenderer(BaseRenderer):
    """Lets DRF's content negotiation accept ``Accept: text/event-stream``."""

    media_type = "text/event-stream"
    format = "sse"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        return json.dumps(data).encode()


def frame(event: AnswerEvent) -> bytes:
    return frame_stored(event.id, event.name, event.data())


def _to_json(data: Any) -> str:
    """Compact JSON, non-ASCII text raw (``ensure_ascii`` would double a CJK frame);
    orjson: a token's frame in a tenth of ``json.dumps``'s time."""
    return orjson.dumps(data).decode()


def frame_stored(seq: int, name: str, data: dict[str, Any]) -> bytes:
    # Model text only ever travels inside JSON, so no text can forge an event.
    return ServerSentEvent(
        data=_escape_separators(_to_json(data)), event=name, id=str(seq)
    ).encode()


def frame_data(body: Any) -> bytes:
    """A bare ``data:`` frame (the OpenAI wire): JSON, or ``[DONE]`` as is."""
    data = body if isinstance(body, str) else _to_json(body)
    return ServerSentEvent(data=_escape_separators(data)).encode()


def _escape_separators(data: str) -> str:
    """U+2028, U+2029 and U+0085 as JSON escapes. SSE ends lines only at CR and LF, but
    many line readers (``str.splitlines``, httpx's ``aiter_lines``, some SDKs) also end
    them here, and would cut a ``data:`` line in two. In JSON these characters occur only
    inside strings, where the escape means the same character. Non-ASCII text otherwise
    stays raw (``ensure_ascii`` would double a CJK frame); the membership tests cost far
    less than the encode around them."""
    if "\u2028" in data or "\u2029" in data or "\x85" in data:
        return (
            data.replace("\u2028", "\\u2028")
            .replace("\u2029", "\\u2029")
            .replace("\x85", "\\u0085")
        )
    return data


def last_event_id(header: str | None, query: str | None = None) -> int:
    """The event id a client resumes after (``Last-Event-ID``, else ``?last_event_id=``),
    0 when neither is given. Anything but 1 to 18 ASCII digits is a 400: ``str.isdigit``
    and ``int`` accept other scripts' digits (``int`` then fails on some, such as
    superscripts), and a longer number overflows the database's integer."""
    raw, param = (header, "Last-Event-ID") if header else (query, "last_event_id")
    if not raw:
        return 0
    if len(raw) > 18 or not raw.isascii() or not raw.isdigit():
        raise InvalidRequest(
            f"{param} must be an event id: ASCII digits, at most 18.",
            code="invalid_value",
            param=param,
        )
    return int(raw)


async def with_pings(
    frames: AsyncIterator[bytes], every: float = PING_SECONDS, *, backlog: int = 1024
) -> AsyncIterator[bytes]:
    """``frames``, with a ``: ping`` comment whenever none came for ``every`` seconds.

    The frames are produced by a task of their own into a bounded queue, and everything
    queued by the time the client has taken the last write goes out as one write: no
    delay when the stream is slow, far fewer writes when tokens come faster than the
    client reads. A frame put while the writer waits goes out before the producer reads
    on (down to the tier, for the next token), so the first token is not delayed by the
    read of the second (docs/gateway.md). When the client leaves, the producer is
    cancelled (the generation settles its usage) and awaited before this generator closes.
    """
    queue: asyncio.Queue[bytes | _End] = asyncio.Queue(maxsize=backlog)

    async def produce() -> None:
        try:
            async for chunk in frames:
                idle = queue.empty()
                await queue.put(chunk)
                if idle:  # the writer waits for it: let it go out before the next is read
                    await asyncio.sleep(0)
        except Exception as exc:
            await queue.put(_End(exc))
            raise
        await queue.put(_End(None))

    producer = asyncio.create_task(produce())
    try:
        while True:
            if queue.empty():
                try:
                    async with asyncio.timeout(every):
                        item = await queue.get()
                except TimeoutError:
                    yield PING
                    continue
            else:
                item = queue.get_nowait()
            batch: list[bytes] = []
            while isinstance(item, bytes):
                batch.append(item)
                if queue.empty():
                    break
                item = queue.get_nowait()
            if batch:
                yield b"".join(batch)
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
    finally:
        if not producer.done():
            producer.cancel()
        await asyncio.wait({producer})
        if not producer.cancelled():
            producer.exception()  # retrieved: any error was raised above, from the queue
        closer = getattr(frames, "aclose", None)
        if closer is not None:
            await closer()


class _End:
    """The producer is done: ``error`` is what ended it, None when it ran out."""

    __slots__ = ("error",)

    def __init__(self, error: Exception | None) -> None:
        self.error = error


def event_stream_response(stream: AsyncIterator[bytes]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
