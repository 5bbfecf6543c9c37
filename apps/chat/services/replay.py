"""Replay and resume of an answer's events (``GET …/events``): the stored events after
``Last-Event-ID``, then, while the answer runs, each new batch as it is stored.

A replay is pushed, not polled: it reads the store when the writer announces the message
(:mod:`apps.chat.feed`) and reads only what is new
(:class:`apps.chat.event_store.EventCursor`).
It also looks on its own every ``REPLAY_RECHECK_SECONDS``: the slow fallback for a writer
in another process on the database (no Redis to announce it), a lost announcement, and an
answer that ended without storing its last events (it then ends from its row).

Open replays count against ``REPLAY_MAX_PER_TEAM`` (:func:`replay_slot_take`): stream
slots as answers hold them (:mod:`apps.usage.limiters`), in Redis when configured (every
process counts together), else in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.accounts.models import Team
from apps.chat import selectors
from apps.chat.event_store import EventCursor, EventStore, event_store
from apps.chat.feed import event_feed
from apps.chat.models import Message
from apps.chat.services.detach import answer_attached
from apps.chat.services.sweep import abandoned_error, answer_longest_seconds
from apps.chat.services.types import Delta, Done, Failed
from apps.core.aio import db_call
from apps.usage import metrics
from apps.usage.budgets import AdmissionUnavailable, RateLimited
from apps.usage.limiters import (
    LimiterUnavailable,
    RedisLimiter,
    Slot,
    limiter,
    slot_refusal,
)

StoredEvent = tuple[int, str, dict[str, Any]]


async def message_events_follow(*, message_id: int, after: int) -> AsyncIterator[StoredEvent]:
    """The message's stored events numbered after ``after``, then, while the answer is
    still streaming, the new ones as they are stored, until ``done``.

    Bounded: an answer still ``streaming`` past the longest an answer can last was
    abandoned by its process. An answer whose last events were never stored (its process
    stopped, or the journal could not write) ends from its row: ``error``, then ``done``.
    """
    store = event_store()
    cursor = EventCursor(message_id, after)
    redis_url = settings.STREAM_BUFFER_REDIS_URL
    try:
        # Watch before the first read: a write between that read and the wait wakes it.
        with event_feed.watch(message_id, redis_url=redis_url) as watch:
            while True:
                events = await store.read(cursor)
                over = False
                if not events:
                    ending = await _ending(message_id, store=store, cursor=cursor)
                    if ending is None:  # still running: until the next write (or a look)
                        await watch.wait(settings.REPLAY_RECHECK_SECONDS)
                        continue
                    events, over = ending, True
                for event in events:
                    yield event
                    if event[1] == Done.name:
                        return
                if not over:  # else its last events came late: read on at once
                    await watch.wait(settings.REPLAY_RECHECK_SECONDS)
    finally:
        await store.aclose()


async def _ending(
    message_id: int, *, store: EventStore, cursor: EventCursor
) -> list[StoredEvent] | None:
    """None while the answer runs. Once it is over (or abandoned, or deleted): its last
    events if they were stored meanwhile, else its end from its row (``error`` if it
    failed, then ``done``)."""
    state = await db_call(selectors.message_state)(message_id=message_id)
    if state is None:  # deleted (with its conversation) meanwhile: nothing more comes
        done = Done(message_id=message_id, finish_reason="cancelled")
        return [(cursor.seq + 1, done.name, done.data())]
    ended = state.status not in Message.RUNNING
    abandoned = not ended and state.age_seconds > answer_longest_seconds()
    if not (ended or abandoned):
        return None
    late = await store.read(cursor)
    if late:
        return late
    found: list[StoredEvent] = []
    seq = cursor.seq
    error = abandoned_error() if abandoned else state.error
    if error:
        seq += 1
        found.append((seq, Failed.name, error))
    finish_reason = "error" if abandoned else state.finish_reason or "stop"
    done = Done(message_id=message_id, finish_reason=finish_reason)
    found.append((seq + 1, done.name, done.data()))
    return found


# -- the cap on open replays


class ReplaySlot:
    """One open replay of a team, held until :meth:`release` (idempotent). A slot whose
    holder never released it (the response was dropped before it started) is released
    when it is collected."""

    def __init__(self, release: Callable[[], None], *, remote: bool) -> None:
        self._finalizer = weakref.finalize(self, release)
        self._finalizer.atexit = False  # a process that ends takes its slots with it
        self.remote = remote

    def release(self) -> None:
        self._finalizer()

    async def arelease(self) -> None:
        """:meth:`release` from the event loop: a slot in Redis is given back on the pool."""
        if self.remote:
            await asyncio.shield(db_call(self.release)())
        else:
            self.release()

    @property
    def held(self) -> bool:
        return self._finalizer.alive


class _LocalReplays:
    """Open replays per team in this process: the count without Redis."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, int] = {}

    def take(self, team_id: int, maximum: int) -> bool:
        with self._lock:
            if self._open.get(team_id, 0) >= maximum:
                return False
            self._open[team_id] = self._open.get(team_id, 0) + 1
            return True

    def free(self, team_id: int) -> None:
        with self._lock:
            left = self._open.get(team_id, 0) - 1
            if left > 0:
                self._open[team_id] = left
            else:
                self._open.pop(team_id, None)

    def open(self, team_id: int) -> int:
        with self._lock:
            return self._open.get(team_id, 0)


local_replays = _LocalReplays()

REPLAY_SLOT_KIND = "replays"


def replay_slot_take(*, team: Team) -> ReplaySlot:
    """A slot for one more open replay of ``team``, or 429 ``too_many_concurrent_streams``
    (with ``Retry-After``) when ``REPLAY_MAX_PER_TEAM`` are open. Redis unreachable: 503
    ``rate_limiter_unavailable``, or this process's count with
    ``RATE_LIMIT_REDIS_FALLBACK=database``."""
    maximum = int(settings.REPLAY_MAX_PER_TEAM)
    slot = Slot(team.pk, maximum, "team", kind=REPLAY_SLOT_KIND)
    store = limiter()
    if isinstance(store, RedisLimiter):
        try:
            return _take_remote(store, slot)
        except LimiterUnavailable as exc:
            if settings.RATE_LIMIT_REDIS_FALLBACK != "database":
                raise AdmissionUnavailable(
                    "Replay limits cannot be checked right now; retry shortly.",
                    headers={"Retry-After": "5"},
                ) from exc
    if not local_replays.take(team.pk, maximum):
        _refuse(slot)
    return ReplaySlot(lambda: local_replays.free(team.pk), remote=False)


def _take_remote(store: RedisLimiter, slot: Slot) -> ReplaySlot:
    token = uuid.uuid4()
    refusal = store.acquire(token=token, buckets=[], slots=[slot], tokens=0, now=timezone.now())
    if refusal is not None:
        _refuse(slot)

    def release() -> None:
        # Redis down: the slot expires by itself (RESERVATION_TTL_SECONDS).
        with contextlib.suppress(LimiterUnavailable):
            store.release(token=token, buckets=[], slots=[slot], difference=0, now=timezone.now())

    return ReplaySlot(release, remote=True)


def _refuse(slot: Slot) -> None:
    refusal = slot_refusal(slot)
    metrics.RATE_LIMITED.labels(refusal.code).inc()
    raise RateLimited(
        f"Too many open replays for this team (at most {slot.maximum}); "
        f"retry in {refusal.retry_after} s.",
        code=refusal.code,
        headers={
            "Retry-After": str(refusal.retry_after),
            "x-ratelimit-limit-streams": str(refusal.limit),
            "x-ratelimit-remaining-streams": "0",
            "x-ratelimit-reset-streams": f"{refusal.retry_after}s",
        },
    )


async def replay_follow(
    *, slot: ReplaySlot, message_id: int, after: int
) -> AsyncIterator[StoredEvent]:
    """:func:`message_events_follow`, giving ``slot`` back when the replay ends, however it
    ends (done, an error, the client gone). An answer detached from its client in this
    process is resumed: it goes on while this reads it (:mod:`.detach`)."""
    try:
        async with answer_attached(message_id, after) as reading:
            async for event in message_events_follow(message_id=message_id, after=after):
                yield event
                reading.read(event[0])
    finally:
        await slot.arelease()


async def answer_text_so_far(*, message_id: int) -> str:
    """The answer text of a running answer's stored events (those of the last quarter
    second may be still on their way to the store)."""
    store = event_store()
    try:
        events = await store.read(EventCursor(message_id, 0))
    finally:
        await store.aclose()
    return "".join(data["text"] for _, name, data in events if name == Delta.name)


async def replay_open(*, team: Team, message_id: int, after: int) -> AsyncIterator[StoredEvent]:
    """A replay of the message's events after ``after`` (:func:`message_events_follow`)
    holding one of ``team``'s replay slots: taken here, before any byte (or 429
    ``too_many_concurrent_streams``), given back when the replay ends, however it ends."""
    slot = await db_call(replay_slot_take)(team=team)
    return replay_follow(slot=slot, message_id=message_id, after=after)
