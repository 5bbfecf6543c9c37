"""Answering, written once, as a stream.

:func:`answer_prepare` does everything that can fail before the first byte: validation,
retrieval, prompt assembly inside the token budget (``context_length_exceeded`` here, the
model never called), and the message rows. :func:`answer_events` then streams the
generation as numbered events — ``message``, ``retrieval``, ``delta``/``reasoning``,
``usage``, ``error``, ``done`` (always last) — and settles usage on success, error and
cancel alike. The SSE view frames these events; the JSON view and the OpenAI-compatible
surface collect the very same stream, so all surfaces record identical usage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction

from apps.accounts.selectors import Caller
from apps.chat.events import event_store
from apps.chat.models import Conversation, Message
from apps.chat.services.models import (
    ModelSpec,
    inference_client,
    model_resolve,
    output_tokens_resolve,
    tokenizer,
)
from apps.core.exceptions import as_application_error, error_body
from apps.knowledge.services import SearchResult, chunk_search
from apps.usage import metrics
from apps.usage.budgets import budget_extend, budget_reserve, budget_settle, max_tokens_cap
from apps.usage.models import Reservation, UsageRecord
from apps.usage.services import usage_columns, usage_record_chat
from inference import (
    SYSTEM_PROMPT,
    ChatMessage,
    ChatRequest,
    ContextLengthExceeded,
    Finished,
    InferenceError,
    Passage,
    Prompt,
    ReasoningDelta,
    TextDelta,
    UpstreamUsage,
    assemble_prompt,
)

logger = logging.getLogger(__name__)

FLUSH_EVERY_SECONDS = 0.25


@dataclass(frozen=True)
class AnswerEvent:
    id: int
    event: str
    data: dict[str, Any]


@dataclass
class PreparedAnswer:
    caller: Caller
    conversation: Conversation
    message: Message
    spec: ModelSpec
    prompt: Prompt
    max_tokens: int
    citations: list[dict[str, Any]]
    want_reasoning: bool = False
    reservation: Reservation | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def request(self) -> ChatRequest:
        return ChatRequest(
            model=self.spec.served_name,
            messages=self.prompt.messages,
            max_tokens=self.max_tokens,
            extra=self.extra,
        )


HISTORY_MESSAGES = 40


def history_of(conversation: Conversation) -> list[ChatMessage]:
    """The most recent completed turns, oldest first, as chat messages. Older ones would not
    fit a context window anyway; prompt assembly drops more if it must."""
    turns = conversation.messages.exclude(status=Message.Status.STREAMING).exclude(content="")
    recent = list(turns.order_by("-created_at", "-pk")[:HISTORY_MESSAGES])
    while recent and recent[-1].role == Message.Role.ASSISTANT:
        recent.pop()  # a history starts with a question
    return [{"role": m.role, "content": m.content} for m in reversed(recent)]


def answer_prepare(
    *,
    caller: Caller,
    conversation: Conversation,
    content: str,
    collection_ids: list[int] | None = None,
    model: str | None = None,
    max_tokens: int | None = None,
    top_k: int = 5,
    rag: bool = True,
    want_reasoning: bool = False,
    history: list[ChatMessage] | None = None,
    instructions: str = "",
) -> PreparedAnswer:
    """Validate, retrieve and assemble; create the message rows. Raises before any byte.

    ``history`` replaces the conversation's stored turns (the OpenAI-compatible surface
    sends its own); ``instructions`` (a client's system message) follow the system prompt.
    """
    spec = model_resolve(alias=model)
    output_tokens = output_tokens_resolve(
        spec=spec,
        max_tokens=max_tokens,
        cap=max_tokens_cap(team=caller.team, api_key=caller.api_key),
    )
    started = time.monotonic()
    turns = history_of(conversation) if history is None else history

    def assembled(passages: list[Passage]) -> Prompt:
        try:
            return assemble_prompt(
                tokenizer=tokenizer(),
                question=content,
                passages=passages,
                history=turns,
                system=f"{SYSTEM_PROMPT}\n\n{instructions}" if instructions else SYSTEM_PROMPT,
                context_window=spec.context_window,
                max_output_tokens=output_tokens,
            )
        except ContextLengthExceeded:
            metrics.CONTEXT_LENGTH_EXCEEDED.inc()
            raise

    # Admission, before anything is embedded or generated: the prompt without passages
    # plus every output token it may generate, held atomically against every limit (429
    # here, never mid-stream). Passages only add tokens, so the bare prompt is a floor.
    bare = assembled([])
    reservation = budget_reserve(
        team=caller.team, api_key=caller.api_key, tokens=bare.prompt_tokens + output_tokens
    )
    try:
        results: list[SearchResult] = []
        if rag:
            collections = (
                collection_ids if collection_ids is not None else conversation.collection_ids
            )
            results = chunk_search(
                caller=caller, query=content, collection_ids=collections or None, top_k=top_k
            )
        passages = [
            Passage(r.chunk.document.title, r.chunk.text, tuple(r.chunk.headings)) for r in results
        ]
        prompt = assembled(passages) if passages else bare
        metrics.RETRIEVAL.observe(time.monotonic() - started)
        # The passages' tokens, held on the same reservation, all or nothing.
        budget_extend(reservation=reservation, tokens=prompt.prompt_tokens - bare.prompt_tokens)
        return _prepared(
            caller=caller,
            conversation=conversation,
            content=content,
            spec=spec,
            prompt=prompt,
            output_tokens=output_tokens,
            results=results,
            reservation=reservation,
            want_reasoning=want_reasoning,
        )
    except BaseException:
        budget_settle(reservation=reservation, actual=0)
        raise


def _prepared(
    *,
    caller: Caller,
    conversation: Conversation,
    content: str,
    spec: ModelSpec,
    prompt: Prompt,
    output_tokens: int,
    results: list[SearchResult],
    reservation: Reservation,
    want_reasoning: bool,
) -> PreparedAnswer:
    citations = [
        {
            "id": number,
            "chunk_id": r.chunk.pk,
            "document_id": r.chunk.document_id,
            "collection_id": r.chunk.collection_id,
            "title": r.chunk.document.title,
            "chunk_index": r.chunk.index,
            "score": round(r.score, 6),
            "snippet": r.snippet,
        }
        for number, r in enumerate(results[: len(prompt.passages)], start=1)
    ]
    with transaction.atomic():
        Message.objects.create(
            conversation=conversation, team=caller.team, role=Message.Role.USER, content=content
        )
        message = Message.objects.create(
            conversation=conversation,
            team=caller.team,
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            citations=citations,
            model=spec.alias,
            served_model=spec.served_name,
        )
        Conversation.objects.filter(pk=conversation.pk).update(updated_at=message.created_at)
    return PreparedAnswer(
        caller=caller,
        conversation=conversation,
        message=message,
        spec=spec,
        prompt=prompt,
        max_tokens=output_tokens,
        citations=citations,
        want_reasoning=want_reasoning,
        reservation=reservation,
    )


@dataclass
class _Generation:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    upstream: UpstreamUsage | None = None
    finish_reason: str | None = None
    started: float = field(default_factory=time.monotonic)
    first_token: float | None = None


async def answer_events(prepared: PreparedAnswer) -> AsyncIterator[AnswerEvent]:
    """The answer's events; the caller may stop iterating at any time (client gone)."""
    message = prepared.message
    journal = _Journal(message.pk)
    generation = _Generation()
    status, error, settled = Message.Status.COMPLETE, None, False
    client = inference_client()

    def emit(name: str, data: dict[str, Any]) -> AnswerEvent:
        return journal.add(name, data)

    metrics.IN_FLIGHT.inc()
    last_chunk: float | None = None
    try:
        yield emit(
            "message",
            {
                "message_id": message.pk,
                "conversation_id": prepared.conversation.pk,
                "model": prepared.spec.alias,
            },
        )
        yield emit("retrieval", {"citations": prepared.citations})
        try:
            async for event in client.stream_chat(prepared.request):
                match event:
                    case TextDelta(text=text) | ReasoningDelta(text=text):
                        now = time.monotonic()
                        if generation.first_token is None:
                            generation.first_token = now
                        if last_chunk is not None:
                            metrics.INTER_TOKEN.labels(prepared.spec.alias).observe(
                                now - last_chunk
                            )
                        last_chunk = now
                        if isinstance(event, TextDelta):
                            generation.text.append(text)
                            yield emit("delta", {"text": text})
                        else:
                            generation.reasoning.append(text)
                            if prepared.want_reasoning:
                                yield emit("reasoning", {"text": text})
                    case Finished(reason=reason):
                        generation.finish_reason = reason
                    case UpstreamUsage():
                        generation.upstream = event
                if await journal.flush_due() and await _cancel_requested(message.pk):
                    status, generation.finish_reason = Message.Status.CANCELLED, "cancelled"
                    break
        except InferenceError as exc:
            status, error = Message.Status.FAILED, _mapped(exc)
            generation.finish_reason = "error"
        finally:
            await client.aclose()  # closing the connection stops the tier generating
        if generation.finish_reason == "length" and generation.reasoning and not generation.text:
            error = _error(
                "reasoning_budget_exhausted",
                "invalid_request_error",
                "max_tokens ran out during reasoning, before any answer token.",
            )
        if error is not None:
            yield emit("error", error)
        usage = await _settle(prepared, generation, status, error)
        settled = True
        yield emit("usage", usage)
        done = emit(
            "done",
            {"message_id": message.pk, "finish_reason": generation.finish_reason or "stop"},
        )
        await journal.close()
        yield done
    except (asyncio.CancelledError, GeneratorExit):
        # The client went away: the upstream request is closed (above), and what was
        # generated so far is billed.
        if not settled:
            generation.finish_reason = "cancelled"
            usage = await asyncio.shield(
                _settle(prepared, generation, Message.Status.CANCELLED, None)
            )
            # Nobody reads these now; a client that resumes with Last-Event-ID does.
            emit("usage", usage)
            emit("done", {"message_id": message.pk, "finish_reason": "cancelled"})
        await asyncio.shield(journal.close())
        raise
    finally:
        metrics.IN_FLIGHT.dec()


def _error(code: str, type: str, message: str) -> dict[str, Any]:
    return error_body(type=type, code=code, message=message)["error"]  # type: ignore[no-any-return]


def _mapped(exc: InferenceError) -> dict[str, Any]:
    error = as_application_error(exc)
    if error is None:  # pragma: no cover - every InferenceError maps
        return _error(exc.code, "upstream_error", str(exc))
    return _error(error.code, error.type, error.message)


def usage_of(prepared: PreparedAnswer, generation: _Generation) -> dict[str, Any]:
    """The usage block: the tier's own when it sent one, else the exact local count."""
    count = tokenizer().count
    reasoning_text = "".join(generation.reasoning)
    upstream = generation.upstream
    if upstream is not None:
        prompt_tokens, completion_tokens = upstream.prompt_tokens, upstream.completion_tokens
        cached_tokens = upstream.cached_tokens
        reasoning_tokens = (
            upstream.reasoning_tokens
            if upstream.reasoning_tokens is not None
            else min(count(reasoning_text), completion_tokens)
            if reasoning_text
            else 0
        )
        source = "upstream"
    else:
        prompt_tokens, cached_tokens = prepared.prompt.prompt_tokens, 0
        reasoning_tokens = count(reasoning_text) if reasoning_text else 0
        answer = "".join(generation.text)
        completion_tokens = reasoning_tokens + (count(answer) if answer else 0)
        source = "counted"
    now = time.monotonic()
    ttft = generation.first_token - generation.started if generation.first_token else None
    decode = now - (generation.first_token or now)
    return {
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "completion_tokens": completion_tokens,
        "reasoning_tokens": reasoning_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "ttft_ms": round(ttft * 1000) if ttft is not None else None,
        "duration_ms": round((now - generation.started) * 1000),
        "tokens_per_second": round(completion_tokens / decode, 2) if decode > 0 else None,
        "model": prepared.spec.alias,
        "source": source,
    }


async def _settle(
    prepared: PreparedAnswer, generation: _Generation, status: str, error: dict[str, Any] | None
) -> dict[str, Any]:
    usage = usage_of(prepared, generation)
    await sync_to_async(_save)(prepared, generation, status, error, usage)
    model = prepared.spec.alias
    if usage["ttft_ms"] is not None:
        metrics.TTFT.labels(model).observe(usage["ttft_ms"] / 1000)
    if usage["tokens_per_second"] is not None:
        metrics.OUTPUT_TOKENS_PER_SECOND.labels(model).observe(usage["tokens_per_second"])
    metrics.TOKENS.labels("chat", model, "input").inc(usage["prompt_tokens"])
    metrics.TOKENS.labels("chat", model, "output").inc(usage["completion_tokens"])
    if status == Message.Status.FAILED and error is not None:
        metrics.UPSTREAM_ERRORS.labels(error["code"]).inc()
    return usage


LEDGER_STATUS = {
    Message.Status.COMPLETE: UsageRecord.Status.OK,
    Message.Status.FAILED: UsageRecord.Status.ERROR,
    Message.Status.CANCELLED: UsageRecord.Status.CANCELLED,
}


@transaction.atomic
def _save(
    prepared: PreparedAnswer,
    generation: _Generation,
    status: str,
    error: dict[str, Any] | None,
    usage: dict[str, Any],
) -> None:
    """The message, its ledger row and the settled reservation, together."""
    caller = prepared.caller
    if prepared.reservation is not None:
        actual = usage["prompt_tokens"] + usage["completion_tokens"]
        budget_settle(reservation=prepared.reservation, actual=actual)
    usage_record_chat(
        team=caller.team,
        api_key=caller.api_key,
        user=caller.user,
        model=prepared.spec.alias,
        usage=usage,
        status=LEDGER_STATUS[status],
        error_code=error["code"] if error else "",
        object_id=str(prepared.message.pk),
    )
    Message.objects.filter(pk=prepared.message.pk).update(
        content="".join(generation.text),
        reasoning="".join(generation.reasoning),
        status=status,
        error=error,
        finish_reason=generation.finish_reason or "stop",
        usage_source=usage["source"],
        **usage_columns(usage),
    )


async def _cancel_requested(message_id: int) -> bool:
    return bool(await Message.objects.filter(pk=message_id, cancel_requested=True).aexists())


class _Journal:
    """Numbers events and writes them to the event store in small batches."""

    def __init__(self, message_id: int) -> None:
        self.message_id = message_id
        self.seq = 0
        self.pending: list[tuple[int, str, dict[str, Any]]] = []
        self.last_flush = time.monotonic()
        self.store = event_store()
        self.closed = False

    def add(self, name: str, data: dict[str, Any]) -> AnswerEvent:
        self.seq += 1
        self.pending.append((self.seq, name, data))
        return AnswerEvent(self.seq, name, data)

    async def flush_due(self) -> bool:
        """Flush if the last flush is old enough; True when it flushed."""
        if time.monotonic() - self.last_flush < FLUSH_EVERY_SECONDS:
            return False
        await self.flush()
        return True

    async def flush(self) -> None:
        pending, self.pending = self.pending, []
        self.last_flush = time.monotonic()
        if pending:
            await self.store.append(self.message_id, pending)

    async def close(self) -> None:
        await self.flush()
        if not self.closed:
            self.closed = True
            await self.store.aclose()
