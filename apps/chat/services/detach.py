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
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from django.conf import settings

from apps.chat.models import Message
from apps.chat.services.types import AnswerEvent, Delta, Reasoning, ToolCall
from apps.core.aio import db_call, loop_cached, redis_client
from apps.usage import metrics

if TYPE_CHECKING:
    from apps.chat.services.run import AnswerRun

logger = logging.getLogger(__name__)

READING_KEY_PREFIX = "ragtier:reading:"
READING_TTL_SECONDS = 6.0
"""How long a resume in another process is taken to read after its last refresh."""


def detach_grace(requested: float | None) -> float:
    """The grace period an answer gets: the request's, up to the cap, else the default."""
    grace = float(settings.STREAM_DETACH_GRACE if requested is None else requested)
    return max(0.0, min(grace, float(settings.STREAM_DETACH_GRACE_MAX)))


class AnswerHold:
    """One answer's readers and grace clock, while it runs in its own task."""

    def __init__(self, run: AnswerRun, grace: float) -> None:
        self.run, self.grace = run, grace
        self.readers = 1  # the connection that asked
        self.queue: asyncio.Queue[AnswerEvent | None] | None = asyncio.Queue()
        self.timer: asyncio.TimerHandle | None = None
        self.unread: list[tuple[int, str]] = []
        """(event id, text) of what was made while nobody read, not read since."""
        self.over = False
        self.task: asyncio.Task[None] | None = None
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
        finally:
            self.over = True
            self._stop_clock()
            answer_holds().pop(self.run.message_id, None)
            if self.queue is not None:
                self.queue.put_nowait(None)
            closer = getattr(events, "aclose", None)
            if closer is not None:
                await asyncio.shield(closer())

    def read(self, seq: int) -> None:
        """A reader has been handed the events up to ``seq``."""
        if self.unread and self.unread[0][0] <= seq:
            self.unread = [(i, text) for i, text in self.unread if i > seq]

    def client_left(self) -> None:
        """The connection that asked is gone: nothing more is queued for it."""
        self.queue = None
        self.leave()

    def attach(self) -> None:
        """A resume reads the answer: the grace clock stops, what is pending is stored."""
        self.readers += 1
        if self.timer is not None:
            self._stop_clock()
            _status_write(self.run.message_id, Message.Status.STREAMING)
        _in_background(self.run.journal.flush())

    def leave(self) -> None:
        self.readers -= 1
        if self.readers == 0 and not self.over and self.grace > 0:
            loop = asyncio.get_running_loop()
            self.timer = loop.call_later(self.grace, self._expire)
            metrics.DETACHED.inc()
            _status_write(self.run.message_id, Message.Status.DETACHED)
        elif self.readers == 0 and not self.over:
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
        _in_background(self._expire_unless_read())

    async def _expire_unless_read(self) -> None:
        try:
            elsewhere = await read_elsewhere(self.run.message_id)
        except Exception as exc:  # Redis out of reach: nobody is known to read
            logger.warning("message %s: cannot look for readers: %r", self.run.message_id, exc)
            elsewhere = False
        if self.over or self.readers > 0:
            return
        if elsewhere:  # look again when that reader's mark would lapse
            self.timer = asyncio.get_running_loop().call_later(READING_TTL_SECONDS, self._expire)
            metrics.DETACHED.inc()
        else:
            self.run.detach_expired()

    async def unread_tokens(self, count: Callable[[str], int]) -> int:
        """The tokens made while nobody read, not read by the time the answer settles;
        none while a reader follows it, here or in another process (it reads to the end)."""
        if self.readers > 0 or not self.unread:
            return 0
        if settings.STREAM_BUFFER_REDIS_URL:
            with contextlib.suppress(Exception):  # unknown: counted as unread
                if await read_elsewhere(self.run.message_id):
                    return 0
        return count("".join(text for _, text in self.unread))


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
    queue = hold.queue
    assert queue is not None  # noqa: S101 - made with the hold
    hold.start(events)
    try:
        while (event := await queue.get()) is not None:
            yield event
            hold.read(event.id)
    finally:
        if not hold.over:
            hold.client_left()


@contextlib.asynccontextmanager
async def answer_attached(message_id: int) -> AsyncIterator[Callable[[int], None]]:
    """A resume of ``message_id``, while the block runs: the answer's grace clock is
    stopped if it runs in this process, and, with Redis, marked read for a process that
    runs it elsewhere; the callable says what was read."""
    marking = _reading_marked(message_id) if settings.STREAM_BUFFER_REDIS_URL else None
    hold = answer_holds().get(message_id)
    try:
        if hold is None or hold.over:
            yield _nothing
            return
        hold.attach()
        try:
            yield hold.read
        finally:
            hold.leave()
    finally:
        if marking is not None:
            marking.cancel()


def _nothing(seq: int) -> None:
    pass


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
    """``streaming`` or ``detached`` on the row of an answer still running: never over the
    status its settlement wrote."""

    def write() -> None:
        running = (Message.Status.STREAMING, Message.Status.DETACHED)
        Message.objects.filter(pk=message_id, status__in=running).update(status=status)

    _in_background(db_call(write)())


_background: set[asyncio.Task[None]] = set()


def _in_background(work: Awaitable[None]) -> None:
    async def run() -> None:
        try:
            await work
        except Exception as exc:  # a status is a hint for pollers: never fails the answer
            logger.warning("detached answer bookkeeping failed: %r", exc)

    task = asyncio.get_running_loop().create_task(run())
    _background.add(task)
    task.add_done_callback(_background.discard)
