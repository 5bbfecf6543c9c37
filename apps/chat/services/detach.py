"""Native SSE answers that outlive their connection.

A phone in a tunnel, a refreshed page: the client that asked drops, and comes back moments
later with ``Last-Event-ID``. Stopping the answer at once would make it ask, and pay,
again; generating to the end for nobody would waste the tier. So the answer *detaches*:

- :func:`answer_outliving_client` runs the answer's events in a task of its own and hands
  them to the connection. When the connection goes before the answer ends, the answer goes
  on (journalling its events, holding its tier slot, its reservation and its stream slot)
  for its grace period (``STREAM_DETACH_GRACE``, or the request's ``stream_grace``).
- A resume in this process (``GET …/events``, :func:`answer_attached`) stops the grace
  clock while it reads; the journal is flushed for it at once, so it reads everything made
  so far, then follows live (:mod:`.replay`). When the last reader leaves, the clock starts
  again.
- A resume in another process (several web processes) says it reads, in Redis: a key per
  answer, refreshed every ``READING_TTL_SECONDS / 3`` while it reads, which the answer's
  process looks at when its clock runs out, and goes on while it is there (at most
  ``READING_TTL_SECONDS`` after the last reader left). Without Redis, only a resume in the
  answer's own process holds it.
- Nobody back in time: the answer is stopped as a cancel stops it (the tier request
  closed, the partial answer settled and billed).
- The tokens made while nobody was reading, and never read, are counted on the ledger row
  (``detached_unread_tokens``) and in ``ragtier_detached_unread_tokens``: the waste the
  grace period costs, reported.

The message row says ``detached`` while nobody reads it, so a client that was killed can
poll ``GET …/messages/{id}`` and find the text so far.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING

from django.conf import settings

from apps.chat.models import Message
from apps.chat.services.types import AnswerEvent, Delta, Reasoning, ToolCall
from apps.core.aio import db_call, in_background, loop_cached, redis_client
from apps.usage import metrics

if TYPE_CHECKING:
    from apps.chat.services.run import AnswerRun

logger = logging.getLogger(__name__)

READING_KEY_PREFIX = "ragtier:reading:"
READING_TTL_SECONDS = 6.0
"""How long a resume in another process is taken to read after its last refresh."""
QUEUE_EVENTS = 1024
"""Events queued for a connection that reads slowly before the answer waits for it."""


def detach_grace(requested: float | None) -> float:
    """The grace period an answer gets: the request's, up to the cap, else the default."""
    grace = float(settings.STREAM_DETACH_GRACE if requested is None else requested)
    return max(0.0, min(grace, float(settings.STREAM_DETACH_GRACE_MAX)))


class Reading:
    """One reader of an answer: the events after ``after`` it has been handed, up to
    ``reached`` (contiguous: a reader gets every event in order)."""

    __slots__ = ("after", "open", "reached")

    def __init__(self, after: int) -> None:
        self.after = self.reached = after
        self.open = True

    def read(self, seq: int) -> None:
        self.reached = seq

    def span(self) -> tuple[int, float]:
        """The ids it has read, or will: an open reader follows the answer to its end."""
        return (self.after, math.inf if self.open else self.reached)


class AnswerHold:
    """One answer's readers and grace clock, while it runs in its own task."""

    def __init__(self, run: AnswerRun, grace: float) -> None:
        self.run, self.grace = run, grace
        self.client = Reading(0)  # the connection that asked
        self.readings = [self.client]
        self.readers = 1
        self.queue: asyncio.Queue[AnswerEvent | None] | None = asyncio.Queue()
        self.room = asyncio.Event()
        """Set while the connection's queue has room (it is read, or it is gone)."""
        self.room.set()
        self.timer: asyncio.TimerHandle | None = None
        self.unread: list[tuple[int, str]] = []
        """(event id, text) of what was made while nobody read, in id order."""
        self.over = False
        self.task: asyncio.Task[None] | None = None
        self.status = StatusWriter(run.message_id)
        run.hold = self

    def start(self, events: AsyncIterator[AnswerEvent]) -> None:
        answer_holds()[self.run.message_id] = self
        self.task = asyncio.get_running_loop().create_task(self._produce(events))

    async def _produce(self, events: AsyncIterator[AnswerEvent]) -> None:
        try:
            async for event in events:
                if self.readers == 0 and (text := _text(event)):
                    self.unread.append((event.id, text))
                if self.queue is not None:
                    self.queue.put_nowait(event)
                    if self.queue.qsize() >= QUEUE_EVENTS:  # a slow reader: wait for it
                        self.room.clear()
                        await self.room.wait()
        except Exception:  # the answer settled itself; what failed is after it (a claim)
            logger.exception("message %s: detached answer's task failed", self.run.message_id)
        finally:
            self.over = True
            self._stop_clock()
            answer_holds().pop(self.run.message_id, None)
            if self.queue is not None:
                self.queue.put_nowait(None)
            closer = getattr(events, "aclose", None)
            if closer is not None:
                await asyncio.shield(closer())

    async def take(self) -> AnswerEvent | None:
        """The connection's next event (None: the end)."""
        assert self.queue is not None  # noqa: S101 - until the connection leaves
        event = await self.queue.get()
        if self.queue.qsize() < QUEUE_EVENTS // 2:
            self.room.set()
        return event

    def client_left(self) -> None:
        """The connection that asked is gone: nothing more is queued for it."""
        self.queue = None
        self.room.set()
        self.leave(self.client)

    def attach(self, after: int) -> Reading:
        """A resume reads the answer after event ``after``: the grace clock stops, what is
        pending is stored for it at once."""
        reading = Reading(after)
        self.readings.append(reading)
        self.readers += 1
        if self.readers == 1:
            self._stop_clock()
            self.status.set(Message.Status.STREAMING)
        in_background(self.run.journal.flush(), what="a detached answer's journal flush")
        return reading

    def leave(self, reading: Reading) -> None:
        reading.open = False
        self.readers -= 1
        if self.readers > 0 or self.over:
            return
        self.status.set(Message.Status.DETACHED)
        if self.grace > 0:
            self.timer = asyncio.get_running_loop().call_later(self.grace, self._expire)
            metrics.DETACHED.inc()
        else:
            self._expire()

    def _stop_clock(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            metrics.DETACHED.dec()

    def _expire(self) -> None:
        """Nobody came back in time, here: unless a resume in another process reads it,
        stop the answer as a cancel does."""
        self._stop_clock()
        if not settings.STREAM_BUFFER_REDIS_URL:
            self.run.detach_expired()
            return
        in_background(self._expire_unless_read(), what="a detached answer's grace")

    async def _expire_unless_read(self) -> None:
        try:
            elsewhere = await read_elsewhere(self.run.message_id)
        except Exception as exc:  # Redis out of reach: nobody is known to read
            logger.warning("message %s: cannot look for readers: %r", self.run.message_id, exc)
            elsewhere = False
        if self.over or self.readers > 0 or self.timer is not None:
            return  # it ended, or a resume came (and maybe went, arming a clock of its own)
        if elsewhere:  # look again when that reader's mark would lapse
            self.timer = asyncio.get_running_loop().call_later(READING_TTL_SECONDS, self._expire)
            metrics.DETACHED.inc()
        else:
            self.run.detach_expired()

    async def unread_tokens(self, count: Callable[[str], int]) -> int:
        """The tokens made while nobody read that no reader was handed, and none that
        follows the answer now will be (here; a resume in another process, known only
        by its mark, is taken to read it all)."""
        spans = _merged(reading.span() for reading in self.readings)
        starts = [after for after, _ in spans]
        texts = [text for seq, text in self.unread if not _within(seq, spans, starts)]
        if not texts:
            return 0
        if settings.STREAM_BUFFER_REDIS_URL:
            with contextlib.suppress(Exception):  # unknown: counted as unread
                if await read_elsewhere(self.run.message_id):
                    return 0
        return count("".join(texts))


def _merged(spans: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """The spans (after, end] joined where they overlap or touch, in order: a resume per
    second for the whole grace period is still a few spans to look ids up in."""
    merged: list[tuple[int, float]] = []
    for after, end in sorted(spans):
        if merged and after <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((after, end))
    return merged


def _within(seq: int, spans: list[tuple[int, float]], starts: list[int]) -> bool:
    r"""Whether ``seq`` is in one of the disjoint, ordered ``spans`` (``starts``: their
    ``after``\ s): a binary search."""
    index = bisect.bisect_left(starts, seq) - 1
    return index >= 0 and seq <= spans[index][1]


class StatusWriter:
    """``streaming`` or ``detached`` on the row of an answer still running, written one at a
    time in order (the last asked wins), never over the status its settlement wrote."""

    def __init__(self, message_id: int) -> None:
        self.message_id = message_id
        self.wanted: str | None = None
        self.written: str | None = None
        self.task: asyncio.Task[None] | None = None

    def set(self, status: str) -> None:
        self.wanted = status
        if self.task is None or self.task.done():
            self.task = in_background(self._write(), what="a detached answer's status write")

    async def _write(self) -> None:
        while self.wanted is not None and self.wanted != self.written:
            status = self.wanted
            try:
                await db_call(_status_write)(self.message_id, status)
            except Exception as exc:  # a hint for pollers: never fails the answer
                logger.warning("message %s: status not written: %r", self.message_id, exc)
            self.written = status


def _text(event: AnswerEvent) -> str:
    match event:
        case Delta(text=text) | Reasoning(text=text):
            return text
        case ToolCall():
            return (event.function or "") + event.arguments
    return ""


@loop_cached
def answer_holds() -> dict[int, AnswerHold]:
    """The answers this process runs on their own, by message id."""
    return {}


async def answer_outliving_client(
    events: AsyncIterator[AnswerEvent], run: AnswerRun, grace: float
) -> AsyncIterator[AnswerEvent]:
    """``events``, run in a task of their own from the first read: when the reader (the
    connection) stops before they end, the answer detaches (see the module)."""
    hold = AnswerHold(run, grace)
    hold.start(events)
    try:
        while (event := await hold.take()) is not None:
            yield event
            hold.client.read(event.id)
    finally:
        if not hold.over:
            hold.client_left()


@contextlib.asynccontextmanager
async def answer_attached(message_id: int, after: int) -> AsyncIterator[Reading]:
    """A resume of ``message_id`` after event ``after``, while the block runs: the answer's
    grace clock is stopped if it runs in this process, and, with Redis, marked read for a
    process that runs it elsewhere; the reader says what it was handed."""
    marking = _reading_marked(message_id) if settings.STREAM_BUFFER_REDIS_URL else None
    hold = answer_holds().get(message_id)
    try:
        if hold is None or hold.over:
            yield Reading(after)
            return
        reading = hold.attach(after)
        try:
            yield reading
        finally:
            hold.leave(reading)
    finally:
        if marking is not None:
            marking.cancel()


def _reading_key(message_id: int) -> str:
    return f"{READING_KEY_PREFIX}{message_id}"


async def read_elsewhere(message_id: int) -> bool:
    """Whether a resume (in any process) has said it reads the answer lately."""
    redis = redis_client(settings.STREAM_BUFFER_REDIS_URL)
    return bool(await redis.exists(_reading_key(message_id)))


def _reading_marked(message_id: int) -> asyncio.Task[None]:
    """A task that says, every third of ``READING_TTL_SECONDS``, that the answer is read."""

    async def mark() -> None:
        redis = redis_client(settings.STREAM_BUFFER_REDIS_URL)
        ttl_ms = int(READING_TTL_SECONDS * 1000)
        while True:
            try:
                await redis.set(_reading_key(message_id), 1, px=ttl_ms)
            except Exception as exc:  # the answer's own process may then stop it
                logger.warning("message %s: cannot mark it read: %r", message_id, exc)
            await asyncio.sleep(READING_TTL_SECONDS / 3)

    return asyncio.get_running_loop().create_task(mark())


def _status_write(message_id: int, status: str) -> None:
    Message.objects.filter(pk=message_id, status__in=Message.RUNNING).update(status=status)
