"""One generation, from the tier slot to settlement, as a stream of typed events.

:func:`answer_start` picks the upstream (the alias's upstreams by affinity to the
conversation, skipping any whose circuit is open; 502 before any byte when all are) and
takes a slot there (a fair queue over teams; 503 ``queue_full`` past the wait limit,
before any byte). Until the first token, a failed upstream hands the answer to the next
one, then to the fallback alias (:class:`inference.Failover`); the alias that served is
the one usage, the ledger and the responses name; :func:`~.generate.answer_events`
streams its events. Nothing waits on the database before the first token: the request to
the tier leaves first, the message keys come from a block taken ahead
(:mod:`apps.core.ids`) and the message rows are written once the first token is out, or
while the tier prefills (``ROWS_AFTER_SECONDS``), whichever comes first.

:class:`AnswerRun` is the ``async with`` block around it: however the block ends (done,
error, the client gone), the reservation is settled exactly once, the usage row and the
message are written in one transaction (:mod:`.settle`), the events are journalled for
replay (:mod:`.journal`), and the tier slot is released.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from types import TracebackType
from typing import Any, TypeVar

from django.db import DatabaseError

from apps.chat.models import Message
from apps.chat.response_cache import (
    CachedAnswer,
    cached_answer_events,
    cached_answer_get,
    cached_answer_put,
)
from apps.chat.services.answer_usage import Generation, usage_observe, usage_of
from apps.chat.services.cancel_watch import cancel_watch
from apps.chat.services.detach import AnswerHold
from apps.chat.services.journal import Journal
from apps.chat.services.prefetch import Prefetched
from apps.chat.services.prepare import PreparedAnswer, answer_prepare
from apps.chat.services.registry import model_registry
from apps.chat.services.request import AnswerRequest
from apps.chat.services.routers import route_reason_served
from apps.chat.services.settle import (
    AnswerKeys,
    ConversationGone,
    Ending,
    messages_create,
    settlement_write,
)
from apps.chat.services.tier import (
    Slot,
    affinity_key,
    breaker,
    cache_salt_derive,
    inference_client,
    route_targets,
    slot_acquire,
)
from apps.chat.services.types import AnswerEvent, Done, Started, UsageReport
from apps.core.aio import db_call, in_background
from apps.core.exceptions import ApplicationError
from apps.core.group_commit import budget_writer
from apps.usage import metrics
from apps.usage.budgets import budget_settle
from apps.usage.energy import energy_meter
from apps.usage.models import Reservation
from inference import Event, Failover, Interrupt, ModelEntry, OpenAIClient, Target

logger = logging.getLogger(__name__)

SETTLE_ATTEMPTS = 8
ROWS_AFTER_SECONDS = 0.005
"""How long an answer's rows wait for its first token to go out before they are written
anyway, the tier still prefilling. A tier that answers at once would otherwise have its
first token wait on the write (the process's one interpreter lock); a cancel or a replay
asked for in that time finds the rows a few milliseconds later, as it would during the
write."""
E = TypeVar("E", bound=AnswerEvent)


async def answer_ready(request: AnswerRequest) -> PreparedAnswer:
    """:func:`~.prepare.answer_prepare` off the event loop. A client gone meanwhile leaves
    no hold behind: the preparation finishes in its thread, and the reservation it made is
    given back as soon as it does (else it would be held until it expires)."""
    work = asyncio.ensure_future(db_call(answer_prepare)(request=request))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        work.add_done_callback(_release_prepared)
        raise


def _release_prepared(work: asyncio.Future[PreparedAnswer]) -> None:
    if work.cancelled() or work.exception() is not None:
        return  # it failed: answer_prepare gave its hold back itself
    reservation = work.result().reservation
    if reservation is not None:
        in_background(_release(reservation), what="releasing a reservation")


async def _release(reservation: Reservation) -> None:
    await db_call(budget_settle)(reservation=reservation, actual=0)


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
        keys = await AnswerKeys.take(prepared)
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
    # response's start and first frames are made, which then overlap with the tier's work.
    await asyncio.sleep(0)
    return run


class _Unqueued:
    """The place of an answer replayed from the response cache: no slot at the tier."""

    waited = 0.0

    async def release(self) -> None:
        pass


def _failover(prepared: PreparedAnswer, keys: AnswerKeys) -> Failover:
    team_id = prepared.caller.team.pk
    affinity = affinity_key(
        team_id=team_id, conversation_id=keys.conversation_id, opening=prepared.opening
    )
    targets = route_targets(
        spec=prepared.spec,
        request=prepared.request,
        affinity=affinity,
        cache_salt=cache_salt_derive(team_id=team_id),
    )
    return Failover(targets, breaker=breaker(), client=_client)


def _client(target: Target) -> OpenAIClient:
    return inference_client(target.upstream, api_key=target.api_key)


class AnswerRun:
    """One generation's state, settled exactly once however it ends (see the module)."""

    def __init__(
        self,
        prepared: PreparedAnswer,
        *,
        lease: Slot | _Unqueued,
        keys: AnswerKeys,
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
        self.generation = Generation()
        self.status: str = Message.Status.COMPLETE
        self.error: ApplicationError | None = None
        self.closing: tuple[UsageReport, Done] | None = None
        self.gone = False
        """The conversation was deleted while this answer ran: it stops, and stores nothing."""
        self.journal = Journal(keep=prepared.store)
        self.entered = False
        self._cancelled: asyncio.Event | None = None
        self.interrupt = Interrupt()
        """Ends a wait for the tier at once when this answer is to stop (cancel, delete)."""
        self.hold: AnswerHold | None = None
        """Its readers and grace clock, when it runs on its own (:mod:`.detach`)."""
        self.expired = False
        """Detached, and nobody came back within its grace period: it stops."""
        events: AsyncIterator[Event]
        if failover is not None:
            events = failover.stream(switch=self._switch, interrupt=self.interrupt)
        else:  # replayed from the response cache
            assert cached is not None  # noqa: S101 - answer_start passes one or the other
            events = cached_answer_events(cached)
        self.upstream = Prefetched(events)
        # Its time at the tier, from now (its request leaves) to its settlement.
        self.meter = energy_meter()
        self.energy = self.meter.begin() if failover is not None else None

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

    @property
    def route_reason(self) -> str:
        """Why :attr:`served` served: the routing's reason, or ``fallback`` / ``breaker``
        when another alias than the one routed to did (:mod:`.routing`)."""
        prepared, failover = self.prepared, self.failover
        if failover is None:  # replayed from the response cache
            return prepared.route_reason
        return route_reason_served(
            prepared.route_reason,
            routed=prepared.spec.alias,
            served=failover.target.alias,
            tried=failover.tried,
        )

    def request_ended(self, request: asyncio.Task[Any]) -> None:
        """The request's task is over. If its response never began (the client left
        between the slot and the first byte), nothing else would settle this run."""
        if not self.entered:
            in_background(self.abandon(), what="abandoning an answer")

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
            self._cancelled = cancel_watch().watch(self.message_id, self.interrupt)
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
        write = db_call(budget_writer.run)(messages_create, self.prepared, self.keys)
        self.rows = asyncio.ensure_future(write)
        self.rows.add_done_callback(self._rows_written)

    def _rows_written(self, rows: asyncio.Future[None]) -> None:
        if not rows.cancelled() and isinstance(rows.exception(), ConversationGone):
            self.gone = True
            self.interrupt()  # stops now, even while the tier prefills
        elif rows.cancelled() or rows.exception() is not None:  # settle writes them
            logger.warning("message %s: rows not written yet: %r", self.message_id, rows)
        else:
            self.journal.message_id = self.message_id  # events may reference the row now

    async def settle(self) -> tuple[UsageReport, Done]:
        """Settle the reservation on what was used, write the ledger row and the message;
        once only (a second call returns the first ending). The answer's last events (its
        usage, then ``done``) are journalled before its message leaves ``streaming``, so
        that whoever sees it ended (a replay, a delete) finds every event stored. If the
        database fails, the write is retried in the background: the stream still ends
        with its usage."""
        if self.closing is None:
            energy = self.meter.end(self.energy)
            served, generation = self.served, self.generation
            usage = usage_of(
                self.prepared,
                generation,
                queued=self.queued,
                served=served,
                cache_hit=self.cached is not None,
            )
            reason = generation.finish_reason or "stop"
            self.closing = (
                self.emit(UsageReport(usage=usage)),
                self.emit(Done(message_id=self.message_id, finish_reason=reason)),
            )
            if self._rows_due is not None:  # not begun: written with the settlement
                self._rows_due.cancel()
                self._rows_due = None
            if self.rows is not None:
                await asyncio.wait({self.rows})
            await self.journal.flush()
            usage_observe(usage, self.status, self.error)
            count = served.tokenizer.load().count
            unread = await self.hold.unread_tokens(count) if self.hold is not None else 0
            metrics.DETACHED_UNREAD_TOKENS.labels(served.alias).inc(unread)
            ending = Ending(
                detached_unread_tokens=unread,
                status=self.status,
                usage=usage,
                text="".join(generation.text),
                reasoning="".join(generation.reasoning),
                finish_reason=reason,
                served=served,
                route_reason=self.route_reason,
                upstream=self.failover.target.upstream if self.failover is not None else "",
                error=self.error,
                energy=energy,
            )
            try:
                await self._save(ending)
            except DatabaseError as exc:
                logger.warning("message %s: not settled yet: %r", self.message_id, exc)
                in_background(self._save_later(ending), what="saving an answer later")
            await self._cache()
        return self.closing

    async def _cache(self) -> None:
        """A complete answer to a cacheable question, kept for the next one to replay."""
        prepared, generation = self.prepared, self.generation
        if (
            prepared.cache_key is None
            or self.gone  # its conversation was deleted: nothing of it outlives the delete
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

    async def _save(self, ending: Ending) -> None:
        write = db_call(budget_writer.run)
        stored = await write(
            settlement_write, self.prepared, self.keys, ending, rows_written=self._rows_ok()
        )
        if stored:
            self.journal.message_id = self.message_id
        else:  # nothing to replay, or its conversation is gone: nothing more is written
            self.gone = self.gone or self.prepared.store
            self.journal.message_id = 0
            self.journal.pending.clear()

    async def _save_later(self, ending: Ending) -> None:
        """Until the database is back (or the reservation's expiry settles it instead)."""
        for attempt in range(SETTLE_ATTEMPTS):
            await asyncio.sleep(min(2**attempt, 30))
            try:
                await self._save(ending)
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
            if self.closing is None:
                # The client went away (or something broke mid-stream): bill what was
                # generated; a client resuming with Last-Event-ID reads the ending.
                if exc is None or isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
                    self.end(Message.Status.CANCELLED, "cancelled")
                else:
                    logger.exception("answer failed mid-stream", exc_info=exc)
                    self.end(Message.Status.FAILED, "error")
                await asyncio.shield(self.settle())
            await asyncio.shield(self.journal.close())
        finally:
            cancel_watch().forget(self.message_id)
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
        """Whether ``POST …/cancel`` or a delete of the conversation asked (in any
        process) to stop this answer, or its grace period ran out with nobody reading."""
        cancelled = self._cancelled is not None and self._cancelled.is_set()
        return self.gone or self.expired or cancelled

    def detach_expired(self) -> None:
        """Nobody resumed this detached answer in time: it stops now, as a cancel."""
        self.expired = True
        self.interrupt()
