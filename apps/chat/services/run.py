"""One generation, from the tier slot to settlement, as a stream of typed events.

:func:`answer_start` picks the upstream (the alias's upstreams by affinity to the
conversation, skipping any whose circuit is open; 502 before any byte when all are) and
takes a slot there (a fair queue over teams; 503 ``queue_full`` past the wait limit,
before any byte). Until the first token, a failed upstream hands the answer to the next
one, then to the fallback alias (:class:`inference.Failover`); the alias that served is
the one usage, the ledger and the responses name. :func:`answer_events` then streams:
``Started``, ``Retrieved``, ``Delta``/``Reasoning``, then ``Failed`` if the tier failed,
``UsageReport`` and ``Done`` (always last). Nothing waits on the database before the
first token: the request to the tier leaves first, the message keys come from a block
taken ahead (:mod:`apps.core.ids`) and the message rows are written once the first
token is out, or while the tier prefills (``ROWS_AFTER_SECONDS``), whichever comes first.

:class:`AnswerRun` is the ``async with`` block around it: however the block ends (done,
error, the client gone), the reservation is settled exactly once, the usage row and the
message are written in one transaction, the events are journalled for replay, and the
tier slot is released.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, TypeVar

from django.db import DatabaseError
from redis.exceptions import RedisError

from apps.chat.events import Events, event_store
from apps.chat.models import Conversation, Message
from apps.chat.services.cache import CachedAnswer, cached_answer_get, cached_answer_put
from apps.chat.services.conversations import conversation_create
from apps.chat.services.models import (
    Slot,
    affinity_key,
    breaker,
    inference_client,
    model_registry,
    route_targets,
    slot_acquire,
)
from apps.chat.services.prepare import PreparedAnswer
from apps.chat.services.types import (
    AnswerEvent,
    Delta,
    Done,
    Failed,
    Reasoning,
    Retrieved,
    Started,
    UsageReport,
)
from apps.core.aio import db_call, loop_cached
from apps.core.exceptions import (
    ApplicationError,
    InvalidRequest,
    as_application_error,
    mid_stream_error,
)
from apps.core.group_commit import budget_writer
from apps.core.ids import key_next
from apps.usage import metrics
from apps.usage.budgets import budget_settle, reservation_record
from apps.usage.models import UsageRecord
from apps.usage.services import usage_record_chat
from apps.usage.values import Usage
from inference import (
    Event,
    Failover,
    Finished,
    InferenceError,
    ModelEntry,
    OpenAIClient,
    ReasoningDelta,
    Target,
    TextDelta,
    UpstreamUsage,
)

logger = logging.getLogger(__name__)

FLUSH_EVERY_SECONDS = 0.25
SETTLE_ATTEMPTS = 8
CANCEL_POLL_SECONDS = 0.25
ROWS_AFTER_SECONDS = 0.005
"""How long an answer's rows wait for its first token to go out before they are written
anyway, the tier still prefilling. A tier that answers at once would otherwise have its
first token wait on the write (the process's one interpreter lock; 1.5 ms of the 6 ms
the native surface added to the time to first token); a cancel or a replay asked for in
that time finds the rows a few milliseconds later, as it would during the write."""
E = TypeVar("E", bound=AnswerEvent)


class ReasoningBudgetExhausted(InvalidRequest):
    code = "reasoning_budget_exhausted"


async def answer_start(prepared: PreparedAnswer) -> AnswerRun:
    """A slot at the tier for this answer, or 503 ``queue_full``; either way before any
    byte. A request refused (or abandoned) while queued never reaches the tier and its
    reservation is released: nothing is billed. Once the slot is held, the request to the
    tier leaves at once, while the response is still being started.

    An answer the response cache holds takes no slot: its stored events are replayed."""
    try:
        cached = None
        if prepared.cache_key is not None:
            cached = await cached_answer_get(team=prepared.caller.team, key=prepared.cache_key)
        keys = await _Keys.take(prepared)
        failover: Failover | None = None
        if cached is not None:
            lease: Slot | _Unqueued = _Unqueued()
            prepared = replace(prepared, citations=cached.citations)
        else:
            failover = _failover(prepared, keys)
            target = await failover.first()
            lease = await slot_acquire(team=prepared.caller.team, upstream=target.upstream)
    except BaseException:
        if prepared.reservation is not None:
            release = db_call(budget_settle)(reservation=prepared.reservation, actual=0)
            await asyncio.shield(release)
        raise
    run = AnswerRun(prepared, lease=lease, keys=keys, failover=failover, cached=cached)
    request = asyncio.current_task()
    if request is not None:
        request.add_done_callback(run.request_ended)
    # The request to the tier (the run's prefetch task) goes out now, before this
    # response's start and first frames are made, which then overlap with the tier's work
    # (the app's added time to first token: 0.25 ms less, bench/gateway.py part 1).
    await asyncio.sleep(0)
    return run


class _Unqueued:
    """The place of an answer replayed from the response cache: no slot at the tier."""

    waited = 0.0

    async def release(self) -> None:
        pass


def _failover(prepared: PreparedAnswer, keys: _Keys) -> Failover:
    affinity = affinity_key(conversation_id=keys.conversation_id, opening=prepared.opening)
    targets = route_targets(spec=prepared.spec, request=prepared.request, affinity=affinity)
    return Failover(targets, breaker=breaker(), client=_client)


def _client(target: Target) -> OpenAIClient:
    return inference_client(target.upstream, api_key=target.api_key)


@dataclass(frozen=True)
class _Keys:
    """The primary keys of the answer's rows, known before they are written."""

    message_id: int
    conversation_id: int
    question_id: int
    """The user's message (0 for an answer not stored); below ``message_id``."""

    @classmethod
    async def take(cls, prepared: PreparedAnswer) -> _Keys:
        conversation = prepared.conversation
        if conversation is not None:
            conversation_id = conversation.pk
        else:  # a new one, unless nothing is stored (0: none)
            conversation_id = await key_next(Conversation) if prepared.store else 0
        question_id = await key_next(Message) if prepared.store else 0
        return cls(
            message_id=await key_next(Message),
            conversation_id=conversation_id,
            question_id=question_id,
        )


@dataclass
class _Generation:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    upstream: UpstreamUsage | None = None
    finish_reason: str | None = None
    started: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None


class AnswerRun:
    """One generation's state, settled exactly once however it ends (see the module)."""

    def __init__(
        self,
        prepared: PreparedAnswer,
        *,
        lease: Slot | _Unqueued,
        keys: _Keys,
        failover: Failover | None,
        cached: CachedAnswer | None = None,
    ) -> None:
        self.prepared = prepared
        self.cached = cached
        """The response cache's answer, replayed instead of calling the tier."""
        self.lease = lease
        self.queued = lease.waited
        self.failover = failover
        self.keys = keys
        self.rows: asyncio.Future[None] | None = None
        self._rows_due: asyncio.TimerHandle | None = None
        self.generation = _Generation()
        self.status = Message.Status.COMPLETE
        self.error: ApplicationError | None = None
        self.usage: Usage | None = None
        self.journal = _Journal(keep=prepared.store)
        self.entered = False
        self._cancelled: asyncio.Event | None = None
        events: AsyncIterator[Event]
        if failover is not None:
            events = failover.stream(switch=self._switch)
        else:  # replayed from the response cache
            assert cached is not None  # noqa: S101 - answer_start passes one or the other
            events = _replayed(cached)
        self.upstream = _Prefetched(events)

    @property
    def message_id(self) -> int:
        return self.keys.message_id

    @property
    def conversation_id(self) -> int:
        return self.keys.conversation_id

    async def _switch(self, target: Target) -> None:
        """Fallback: this run's slot moves to ``target``'s upstream."""
        await self.lease.release()
        self.lease = await slot_acquire(team=self.prepared.caller.team, upstream=target.upstream)
        self.queued += self.lease.waited

    @property
    def served(self) -> ModelEntry:
        """The entry of the alias that served (or was last tried)."""
        if self.failover is None:  # replayed from the response cache
            return self.prepared.spec.entry
        return model_registry().get(self.failover.target.alias) or self.prepared.spec.entry

    def request_ended(self, request: asyncio.Task[Any]) -> None:
        """The request's task is over. If its response never began (the client left
        between the slot and the first byte), nothing else would settle this run."""
        if not self.entered:
            _in_background(self.abandon())

    async def abandon(self) -> None:
        """End a run that never streamed: the tier request closed, billed as cancelled."""
        async with self:
            await self.upstream.aclose()
            await self.lease.release()

    def emit(self, event: E) -> E:
        """``event`` numbered and journalled (for replay); what the client is sent."""
        return self.journal.add(event)

    def open(self) -> Started:
        """The answer's first event. Its rows are due (see :meth:`write_rows`)."""
        prepared = self.prepared
        if prepared.store:
            loop = asyncio.get_running_loop()
            self._rows_due = loop.call_later(ROWS_AFTER_SECONDS, self.write_rows)
            self._cancelled = _cancel_watch().watch(self.message_id)
        return Started(
            message_id=self.message_id,
            conversation_id=self.conversation_id,
            model=prepared.spec.alias,
        )

    def write_rows(self) -> None:
        """The user's message and the assistant's (streaming) one, and a new conversation,
        written in the background (their keys were taken ahead), once: after the first
        token has gone out, or ``ROWS_AFTER_SECONDS`` after the answer opened. Nothing, for
        an answer that is not to be stored (the OpenAI surface's default), or once the
        answer is settling (settling writes them)."""
        if self._rows_due is None:
            return
        self._rows_due.cancel()
        self._rows_due = None
        write = db_call(budget_writer.run)(_messages_create, self.prepared, self.keys)
        self.rows = asyncio.ensure_future(write)
        self.rows.add_done_callback(self._rows_written)

    def _rows_written(self, rows: asyncio.Future[None]) -> None:
        if rows.cancelled() or rows.exception() is not None:  # settle writes them
            logger.warning("message %s: rows not written yet: %r", self.message_id, rows)
        else:
            self.journal.message_id = self.message_id  # events may reference the row now

    async def settle(self) -> Usage:
        """Settle the reservation on what was used, write the ledger row and the message;
        once only (a second call returns the first usage). If the database fails, the
        write is retried in the background: the stream still ends with its usage."""
        if self.usage is None:
            self.usage = usage_of(
                self.prepared,
                self.generation,
                queued=self.queued,
                served=self.served,
                cache_hit=self.cached is not None,
            )
            if self._rows_due is not None:  # not begun: written with the settlement
                self._rows_due.cancel()
                self._rows_due = None
            if self.rows is not None:
                await asyncio.wait({self.rows})
            _observe(self.usage, self.status, self.error)
            try:
                await self._save()
            except DatabaseError as exc:
                logger.warning("message %s: not settled yet: %r", self.message_id, exc)
                _in_background(self._save_later())
            await self._cache()
        return self.usage

    async def _cache(self) -> None:
        """A complete answer to a cacheable question, kept for the next one to replay."""
        prepared, generation = self.prepared, self.generation
        if (
            prepared.cache_key is None
            or self.cached is not None
            or self.status != Message.Status.COMPLETE
            or self.error is not None
            or not generation.text
        ):
            return
        answer = CachedAnswer(
            citations=prepared.citations,
            text=generation.text,
            reasoning=generation.reasoning,
            finish_reason=generation.finish_reason or "stop",
        )
        await cached_answer_put(team=prepared.caller.team, key=prepared.cache_key, answer=answer)

    async def _save(self) -> None:
        written = self.rows is not None and self._rows_ok()
        await db_call(budget_writer.run)(_save, self, rows_written=written)
        self.journal.message_id = self.message_id

    async def _save_later(self) -> None:
        """Until the database is back (or the reservation's expiry settles it instead)."""
        for attempt in range(SETTLE_ATTEMPTS):
            await asyncio.sleep(min(2**attempt, 30))
            try:
                await self._save()
            except DatabaseError as exc:
                logger.warning(
                    "message %s: settling, attempt %d: %r", self.message_id, attempt, exc
                )
            else:
                await self.journal.flush()
                return
        logger.error("message %s: not settled; its reservation will expire", self.message_id)

    def _rows_ok(self) -> bool:
        rows = self.rows
        return rows is not None and not rows.cancelled() and rows.exception() is None

    async def __aenter__(self) -> AnswerRun:
        if self.entered:
            raise RuntimeError("an answer runs once")
        self.entered = True
        metrics.IN_FLIGHT.inc()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if self.usage is None:
                # The client went away (or something broke mid-stream): bill what was
                # generated; a client resuming with Last-Event-ID reads the ending.
                if exc is None or isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
                    self.end(Message.Status.CANCELLED, "cancelled")
                else:
                    logger.exception("answer failed mid-stream", exc_info=exc)
                    self.end(Message.Status.FAILED, "error")
                usage = await asyncio.shield(self.settle())
                self.emit(UsageReport(usage=usage))
                reason = self.generation.finish_reason or "cancelled"
                self.emit(Done(message_id=self.message_id, finish_reason=reason))
            await asyncio.shield(self.journal.close())
        finally:
            _cancel_watch().forget(self.message_id)
            await asyncio.shield(self.lease.release())
            metrics.IN_FLIGHT.dec()

    def end(
        self, status: str, finish_reason: str, *, error: ApplicationError | None = None
    ) -> None:
        """How the generation ended, when the tier did not say (cancel, failure)."""
        self.status, self.generation.finish_reason = status, finish_reason
        self.error = error or self.error

    @property
    def cancel_requested(self) -> bool:
        """Whether ``POST …/cancel`` asked (in any process) to stop this answer."""
        return self._cancelled is not None and self._cancelled.is_set()


async def answer_events(run: AnswerRun) -> AsyncIterator[AnswerEvent]:
    """The answer's events; the caller may stop iterating at any time (client gone)."""
    prepared, generation = run.prepared, run.generation
    upstream = run.upstream
    async with run:
        try:
            yield run.emit(run.open())
            yield run.emit(Retrieved(citations=prepared.citations))
            try:
                async for event in upstream:
                    match event:
                        case TextDelta(text=text) | ReasoningDelta(text=text):
                            _tick(run, time.monotonic())
                            if isinstance(event, TextDelta):
                                generation.text.append(text)
                                yield run.emit(Delta(text=text))
                            else:
                                generation.reasoning.append(text)
                                if prepared.want_reasoning:
                                    yield run.emit(Reasoning(text=text))
                            run.write_rows()  # the first token is out
                        case Finished(reason=reason):
                            generation.finish_reason = reason
                        case UpstreamUsage():
                            generation.upstream = event
                    if run.cancel_requested:
                        run.end(Message.Status.CANCELLED, "cancelled")
                        break
            except InferenceError as exc:
                run.end(Message.Status.FAILED, "error", error=as_application_error(exc))
            except Exception as exc:  # anything else mid-stream: said in-band, then settled
                logger.exception("answer %s failed mid-stream", run.message_id)
                run.end(Message.Status.FAILED, "error", error=mid_stream_error(exc))
        finally:
            await upstream.aclose()  # closing the connection stops the tier generating
            await run.lease.release()  # the next request in the queue may go now
        if generation.finish_reason == "length" and generation.reasoning and not generation.text:
            run.error = ReasoningBudgetExhausted(
                "max_tokens ran out during reasoning, before any answer token."
            )
        if run.error is not None:
            run.status = Message.Status.FAILED
            yield run.emit(Failed(error=run.error))
        usage = await run.settle()
        yield run.emit(UsageReport(usage=usage))
        yield run.emit(
            Done(message_id=run.message_id, finish_reason=generation.finish_reason or "stop")
        )


_background: set[asyncio.Task[None]] = set()


def _in_background(work: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(work)
    _background.add(task)  # the loop keeps only a weak reference
    task.add_done_callback(_background.discard)


def _tick(run: AnswerRun, now: float) -> None:
    generation = run.generation
    if generation.first_token is None:
        generation.first_token = now
    elif generation.last_token is not None and run.cached is None:
        metrics.INTER_TOKEN.labels(run.prepared.spec.alias).observe(now - generation.last_token)
    generation.last_token = now


T = TypeVar("T")
_END: Any = object()


class _Prefetched(AsyncIterator[T]):
    """An async iterator whose first item is fetched in the background from the start, so
    the work that fetch begins (the request to the tier) overlaps with the caller's."""

    def __init__(self, iterator: AsyncIterator[T]) -> None:
        self._iterator = iterator
        self._first: asyncio.Future[T] | None = asyncio.ensure_future(anext(iterator, _END))

    async def __anext__(self) -> T:
        if self._first is not None:
            first, self._first = self._first, None
            item = await first
            if item is _END:
                raise StopAsyncIteration
            return item
        return await anext(self._iterator)

    async def aclose(self) -> None:
        if self._first is not None and not self._first.done():
            self._first.cancel()
            await asyncio.wait({self._first})
        closer = getattr(self._iterator, "aclose", None)
        if closer is not None:
            await closer()


async def _replayed(cached: CachedAnswer) -> AsyncIterator[Event]:
    """A cached answer as the tier's events: its reasoning, its deltas, how it finished."""
    for text in cached.reasoning:
        yield ReasoningDelta(text)
    for text in cached.text:
        yield TextDelta(text)
    yield Finished(cached.finish_reason)


def usage_of(
    prepared: PreparedAnswer,
    generation: _Generation,
    *,
    queued: float,
    served: ModelEntry,
    cache_hit: bool = False,
) -> Usage:
    """The usage block: the tier's own when it sent one, else the exact local count, with
    the tokenizer of the alias that served (a fallback alias counts its own prompt); for a
    cache hit, no token (nothing was generated: only the query's embedding, charged by the
    search, was spent)."""
    counter = served.tokenizer.load()
    count = counter.count
    reasoning_text = "".join(generation.reasoning)
    upstream = generation.upstream
    if cache_hit:
        prompt_tokens = cached_tokens = completion_tokens = reasoning_tokens = 0
    elif upstream is not None:
        prompt_tokens, completion_tokens = upstream.prompt_tokens, upstream.completion_tokens
        cached_tokens = upstream.cached_tokens
        if upstream.reasoning_tokens is not None:
            reasoning_tokens = upstream.reasoning_tokens
        else:
            reasoning_tokens = (
                min(count(reasoning_text), completion_tokens) if reasoning_text else 0
            )
    else:
        prompt_tokens, cached_tokens = prepared.prompt.prompt_tokens, 0
        if served.tokenizer != prepared.spec.entry.tokenizer:
            prompt_tokens = counter.count_chat(prepared.prompt.messages)
        reasoning_tokens = count(reasoning_text) if reasoning_text else 0
        answer = "".join(generation.text)
        completion_tokens = reasoning_tokens + (count(answer) if answer else 0)
    now = time.monotonic()
    first = generation.first_token
    decode = now - (first or now)
    return Usage(
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        reasoning_tokens=reasoning_tokens,
        ttft_ms=round((first - generation.started) * 1000) if first is not None else None,
        duration_ms=round((now - generation.started) * 1000),
        tokens_per_second=round(completion_tokens / decode, 2)
        if decode > 0 and not cache_hit
        else None,
        queue_ms=round(queued * 1000),
        model=served.alias,
        source="upstream" if upstream is not None else "counted",
        cache_hit=cache_hit,
    )


def _observe(usage: Usage, status: str, error: ApplicationError | None) -> None:
    model = usage.model
    if usage.ttft_ms is not None and not usage.cache_hit:  # a replay's TTFT is the cache's
        metrics.TTFT.labels(model).observe(usage.ttft_ms / 1000)
    if usage.tokens_per_second is not None:
        metrics.OUTPUT_TOKENS_PER_SECOND.labels(model).observe(usage.tokens_per_second)
    metrics.TOKENS.labels("chat", model, "input").inc(usage.prompt_tokens)
    metrics.TOKENS.labels("chat", model, "output").inc(usage.completion_tokens)
    if status == Message.Status.FAILED and error is not None:
        metrics.UPSTREAM_ERRORS.labels(error.code).inc()


def _messages_create(prepared: PreparedAnswer, keys: _Keys) -> None:
    """The question and the (streaming) answer, in one insert, with their keys taken
    ahead. Called through the one writer: all or nothing."""
    caller, team = prepared.caller, prepared.caller.team
    if prepared.reservation is not None:
        reservation_record(reservation=prepared.reservation)
    conversation = prepared.conversation
    if conversation is None:
        conversation = conversation_create(caller=caller, title="openai", key=keys.conversation_id)
    question = Message(
        pk=keys.question_id,
        conversation=conversation,
        team=team,
        role=Message.Role.USER,
        content=prepared.question,
    )
    answer = Message(
        pk=keys.message_id,
        conversation=conversation,
        team=team,
        role=Message.Role.ASSISTANT,
        status=Message.Status.STREAMING,
        citations=prepared.citations,
        model=prepared.spec.alias,
        served_model=prepared.spec.served_name,
    )
    Message.objects.bulk_create([question, answer])  # created_at in this order, one insert
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=answer.created_at)


LEDGER_STATUS = {
    Message.Status.COMPLETE: UsageRecord.Status.OK,
    Message.Status.FAILED: UsageRecord.Status.ERROR,
    Message.Status.CANCELLED: UsageRecord.Status.CANCELLED,
}


def _save(run: AnswerRun, *, rows_written: bool) -> None:
    """The settled reservation, the ledger row and the message, together (in one
    transaction, shared with other answers': :mod:`apps.core.group_commit`). A run whose
    rows were not written (the client left at once, the database failed) writes them."""
    prepared, generation, usage = run.prepared, run.generation, run.usage
    assert usage is not None  # noqa: S101 - settle computes it first
    message_id = run.message_id
    stored = prepared.store
    if stored and not rows_written and not Message.objects.filter(pk=message_id).exists():
        _messages_create(prepared, run.keys)
    caller = prepared.caller
    if prepared.reservation is not None:
        budget_settle(reservation=prepared.reservation, actual=usage.total_tokens)
    error = Failed(error=run.error).data() if run.error is not None else None
    served = run.served
    usage_record_chat(
        team=caller.team,
        api_key=caller.api_key,
        user=caller.user,
        model=served.alias,
        requested_model=prepared.requested or prepared.spec.alias,
        upstream=run.failover.target.upstream if run.failover is not None else "",
        price=served.price,
        energy=served.energy,
        usage=usage,
        status=LEDGER_STATUS[run.status],
        error_code=run.error.code if run.error else "",
        object_id=str(message_id),
    )
    if not stored:
        return  # the ledger row only: tokens and cost, no content
    Message.objects.filter(pk=message_id).update(
        content="".join(generation.text),
        reasoning="".join(generation.reasoning),
        status=run.status,
        error=error,
        finish_reason=generation.finish_reason or "stop",
        usage_source=usage.source,
        model=served.alias,
        served_model=served.model,
        **usage.columns(),
    )


class _CancelWatch:
    """Cancel requests for every answer this process streams, read in one query every
    ``CANCEL_POLL_SECONDS`` (not one query per answer per flush: a thousand open streams
    would be a thousand queries a second)."""

    def __init__(self) -> None:
        self.events: dict[int, asyncio.Event] = {}
        self.task: asyncio.Task[None] | None = None

    def watch(self, message_id: int) -> asyncio.Event:
        event = self.events.setdefault(message_id, asyncio.Event())
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._poll())
        return event

    def forget(self, message_id: int) -> None:
        self.events.pop(message_id, None)

    async def _poll(self) -> None:
        while self.events:
            await asyncio.sleep(CANCEL_POLL_SECONDS)
            try:
                asked = await db_call(_cancel_requested_among)(list(self.events))
            except DatabaseError as exc:  # the next round tries again
                logger.warning("cannot read cancel requests: %s", exc)
                continue
            for message_id in asked:
                if message_id in self.events:
                    self.events[message_id].set()


@loop_cached
def _cancel_watch() -> _CancelWatch:
    return _CancelWatch()


def _cancel_requested_among(message_ids: list[int]) -> list[int]:
    asked = Message.objects.filter(pk__in=message_ids, cancel_requested=True)
    return list(asked.values_list("pk", flat=True))


class _Journal:
    """Numbers events and has them written to the event store in small batches (or only
    numbers them, for an answer that is not to be stored: ``keep=False``)."""

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.message_id = 0
        self.seq = 0
        self.pending: list[AnswerEvent] = []
        self.writing: asyncio.Future[None] | None = None
        """The group write holding this journal's earlier events, while it is under way."""
        self.writer = _journal_writer() if keep else None
        self.store = event_store()
        self.closed = False

    def add(self, event: E) -> E:
        self.seq += 1
        numbered = replace(event, id=self.seq)
        if self.writer is not None:
            self.pending.append(numbered)  # rendered at flush, off the per-token path
            self.writer.mark(self)
        return numbered

    def take(self) -> Events:
        pending, self.pending = self.pending, []
        return [(e.id, e.name, e.data()) for e in pending]

    async def flush(self) -> None:
        """Write what is pending, now, after any group write holding earlier events (a
        Redis list keeps the order of writes). The journal serves replay only: a store
        that fails (Redis or the database busy or down) never fails the answer itself; the
        events stay pending and the next flush tries again."""
        if self.writing is not None:
            await asyncio.shield(self.writing)
        if not (self.pending and self.message_id):
            return
        pending = self.pending
        try:
            await self.store.append(self.message_id, self.take())
        except (RedisError, DatabaseError, TimeoutError) as exc:
            logger.warning("message %s: events not journalled yet: %r", self.message_id, exc)
            self.pending = pending + self.pending

    async def close(self) -> None:
        await self.flush()
        if not self.closed:
            self.closed = True
            if self.writer is not None:
                self.writer.dirty.discard(self)
            await self.store.aclose()


class _JournalWriter:
    """The pending events of every answer this process streams, written together every
    ``FLUSH_EVERY_SECONDS``: one insert (or one Redis round trip) for all of them. One
    write per answer would be a thousand a second for a thousand streams at a token a
    second, and on SQLite, a thousand commits."""

    def __init__(self) -> None:
        self.dirty: set[_Journal] = set()
        self.task: asyncio.Task[None] | None = None
        self.store = event_store()

    def mark(self, journal: _Journal) -> None:
        self.dirty.add(journal)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self.dirty:
            await asyncio.sleep(FLUSH_EVERY_SECONDS)
            await self.write()

    async def write(self) -> None:
        ready = [j for j in self.dirty if j.message_id and j.pending and j.writing is None]
        self.dirty.difference_update(j for j in list(self.dirty) if not j.pending)
        if not ready:
            return
        self.dirty.difference_update(ready)
        pending = {journal: journal.pending for journal in ready}
        batches = {journal.message_id: journal.take() for journal in ready}
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for journal in ready:
            journal.writing = written
        try:
            await self.store.append_many(batches)
        except Exception as exc:  # the events stay pending; the next round tries again
            logger.warning("%d answers: events not journalled yet: %r", len(ready), exc)
            for journal, events in pending.items():
                journal.pending = events + journal.pending
                self.dirty.add(journal)
        finally:
            for journal in ready:
                journal.writing = None
            written.set_result(None)


@loop_cached
def _journal_writer() -> _JournalWriter:
    return _JournalWriter()
