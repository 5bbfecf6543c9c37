"""How an answer goes out: the native wire (typed SSE events; a JSON body) and OpenAI's
(``chat.completion.chunk`` frames then ``[DONE]``; a ``chat.completion`` body), and the one
:func:`answer_respond` both surfaces use.

Every surface consumes the same event stream, so all record identical usage; a refusal at
the queue (503 ``queue_full``) comes before any byte, and an error after the stream
started goes in-band, then the stream ends as usual.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from django.http import HttpResponseBase
from rest_framework.response import Response

from apps.chat.services import (
    AnswerEvent,
    CollectedAnswer,
    PreparedAnswer,
    StoredEvent,
    answer_collect,
    answer_events,
    answer_outliving_client,
    answer_start,
    detach_grace,
)
from apps.chat.services.types import (
    Citation,
    Delta,
    Done,
    Failed,
    Reasoning,
    Retrieved,
    Started,
    ToolCall,
    UsageReport,
)
from apps.chat.sse import event_stream_response, frame, frame_data, with_pings
from apps.core.aio import db_call
from apps.core.exceptions import ApplicationError
from apps.core.idempotency import idempotency_complete
from apps.core.models import IdempotencyKey
from apps.usage.values import Usage


class Wire(Protocol):
    created_status: int
    detaches: bool
    """Whether a streamed answer outlives a dropped connection (:mod:`.services.detach`):
    its client can resume it."""

    def frames(self, events: AsyncIterator[AnswerEvent]) -> AsyncIterator[bytes]: ...

    def body(self, prepared: PreparedAnswer, answer: CollectedAnswer) -> dict[str, Any]: ...


async def answer_respond(
    prepared: PreparedAnswer,
    *,
    wire: Wire,
    stream: bool,
    claim: IdempotencyKey | None = None,
) -> HttpResponseBase:
    """Take a slot at the tier (or raise 503 ``queue_full``), then stream the answer in
    ``wire``'s framing, or collect it whole (an error with no content raises, for the
    exception handler to answer with its status and headers). A stream the client can
    resume outlives its connection for its grace period; a whole answer, or one streamed
    to a client that cannot resume (OpenAI's), stops when its client goes.

    ``claim``: the request's ``Idempotency-Key``, completed with the answer's message once
    its events are all stored (a stream, however it ended; a whole answer, unless it
    failed: then the caller releases the key)."""
    run = await answer_start(prepared)
    events = answer_events(run)
    if stream:
        if claim is not None:
            events = _completing(events, claim, message_id=run.message_id)
        grace = detach_grace(prepared.stream_grace) if wire.detaches and prepared.store else 0
        if grace > 0:
            events = answer_outliving_client(events, run, grace)
        return event_stream_response(with_pings(wire.frames(events)))
    answer = await answer_collect(events)
    if answer.error is not None and not answer.content:
        raise answer.error
    if claim is not None:
        await db_call(idempotency_complete)(
            claim=claim, resource_id=answer.message_id, response_status=wire.created_status
        )
    return Response(wire.body(prepared, answer), status=wire.created_status)


async def _completing(
    events: AsyncIterator[AnswerEvent], claim: IdempotencyKey, *, message_id: int
) -> AsyncIterator[AnswerEvent]:
    try:
        async for event in events:
            yield event
    finally:
        closer = getattr(events, "aclose", None)
        if closer is not None:
            await asyncio.shield(closer())  # its events journalled before the key completes
        complete = db_call(idempotency_complete)(
            claim=claim, resource_id=message_id, response_status=200
        )
        await asyncio.shield(complete)


class NativeWire:
    created_status = 201
    detaches = True

    async def frames(self, events: AsyncIterator[AnswerEvent]) -> AsyncIterator[bytes]:
        async for event in events:
            yield frame(event)

    def body(self, prepared: PreparedAnswer, answer: CollectedAnswer) -> dict[str, Any]:
        return {
            "id": answer.message_id,
            "content": answer.content,
            "citations": answer.citations,
            "usage": answer.usage.as_dict() if answer.usage else None,
            "finish_reason": answer.finish_reason,
            **({"logprobs": answer.logprobs} if answer.logprobs else {}),
        }


@dataclass(frozen=True)
class OpenAIWire:
    include_usage: bool = False
    created_status = 200
    detaches = False  # OpenAI's clients cannot resume: the answer stops with them

    async def frames(self, events: AsyncIterator[AnswerEvent]) -> AsyncIterator[bytes]:
        base: dict[str, Any] = {
            "object": "chat.completion.chunk",
            "created": int(time.time()),
        }
        citations: list[Citation] = []
        usage: Usage | None = None

        def chunk(
            delta: dict[str, Any],
            finish: str | None = None,
            logprobs: dict[str, Any] | None = None,
            **extra: Any,
        ) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return frame_data({**base, "choices": [choice], **extra})

        async for event in events:
            match event:
                case Started(message_id=message_id, model=model):
                    base = {"id": f"chatcmpl-{message_id}", **base, "model": model}
                    yield chunk({"role": "assistant", "content": ""})
                case Retrieved(citations=found):
                    citations = found
                case Delta(text=text, logprobs=()):
                    yield chunk({"content": text})
                case Delta(text=text, logprobs=logprobs):
                    yield chunk({"content": text}, logprobs={"content": list(logprobs)})
                case Reasoning(text=text):  # vLLM's and DeepSeek's field
                    yield chunk({"reasoning_content": text})
                case ToolCall():  # OpenAI's argument deltas, one fragment a chunk
                    yield chunk({"tool_calls": [event.data()]})
                case Failed():
                    yield frame_data({"error": event.data()})
                case UsageReport(usage=reported):
                    usage = reported
                    base["model"] = reported.model or base.get("model")  # after fallback
                case Done(finish_reason=reason):
                    yield chunk({}, finish=_finish(reason), citations=citations)
        if self.include_usage and usage is not None:
            yield frame_data({**base, "choices": [], "usage": _usage(usage)})
        yield frame_data("[DONE]")

    def body(self, prepared: PreparedAnswer, answer: CollectedAnswer) -> dict[str, Any]:
        return openai_completion(answer, model=prepared.spec.alias)


def openai_completion(answer: CollectedAnswer, *, model: str = "") -> dict[str, Any]:
    """``answer`` as a ``chat.completion``; ``model``: the alias named, where the answer
    does not say which served. The message carries ``reasoning_content`` (as vLLM and
    DeepSeek send it) only when the model reasoned, and ``tool_calls`` only when it called
    a function."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    if answer.tool_calls:  # as OpenAI: content null when the model only called
        message["tool_calls"] = answer.tool_calls
        message["content"] = answer.content or None
    return {
        "id": f"chatcmpl-{answer.message_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": answer.model or model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {"content": answer.logprobs} if answer.logprobs else None,
                "finish_reason": _finish(answer.finish_reason),
            }
        ],
        "usage": _usage(answer.usage) if answer.usage else None,
        "citations": answer.citations,
    }


async def stored_events(events: AsyncIterator[StoredEvent]) -> AsyncIterator[AnswerEvent]:
    """An answer's stored events (a replay) as the typed events they were stored from, so
    that a surface frames a replay as it framed the answer."""
    async for seq, name, data in events:
        event = _typed(name, data)
        if event is not None:
            yield replace(event, id=seq)


def _typed(name: str, data: dict[str, Any]) -> AnswerEvent | None:
    match name:
        case Started.name:
            return Started(
                message_id=data["message_id"],
                conversation_id=data["conversation_id"],
                model=data["model"],
            )
        case Retrieved.name:
            return Retrieved(citations=data["citations"])
        case Delta.name:
            return Delta(text=data["text"], logprobs=tuple(data.get("logprobs") or ()))
        case Reasoning.name:
            return Reasoning(text=data["text"])
        case ToolCall.name:
            function = data["function"]
            return ToolCall(
                index=data["index"],
                call_id=data.get("id"),
                function=function.get("name"),
                arguments=function["arguments"],
            )
        case UsageReport.name:
            fields = {k: v for k, v in data.items() if k != "total_tokens"}
            return UsageReport(usage=Usage(**fields))
        case Failed.name:
            error = ApplicationError(data["message"], code=data["code"], param=data["param"])
            error.type = data["type"]
            return Failed(error=error)
        case Done.name:
            return Done(message_id=data["message_id"], finish_reason=data["finish_reason"])
    return None


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "cache_hit": usage.cache_hit,  # extension: answered by the response cache
    }


def _finish(reason: str) -> str:
    return reason if reason in ("stop", "length", "content_filter", "tool_calls") else "stop"
