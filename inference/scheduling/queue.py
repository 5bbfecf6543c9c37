"""The contract of a fair, capacity-bounded queue in front of an inference upstream, and
what both implementations share: the lease, the fair order, the Retry-After estimate.

llama.cpp's server runs one request at a time and vLLM runs ``max_num_seqs``; anything
sent beyond that waits inside the server, invisible, unfair and uncancellable. So the app
holds the line itself: at most ``capacity`` requests are in flight to an upstream, and the
rest wait here, served by deficit round robin over teams (each team gets ``weight``
requests per round, FIFO within a team), so one team's burst cannot starve another.

A waiter that gives up (timeout) gets :class:`~inference.errors.QueueFull` with a
``retry_after`` estimated from the measured service time; a waiter that is cancelled
(client gone) leaves the queue at once and never holds a slot.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from types import TracebackType
from typing import Generic, Protocol, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=Hashable)

# Before the first lease is released there is no measured service time. Five seconds is
# a guess at one streamed answer of a few hundred tokens on either tier; it only sets the
# first Retry-After, and the first measurement replaces it.
DEFAULT_SERVICE_SECONDS = 5.0
# Weight of the newest hold duration in the moving average: about the last ten requests
# count, so the estimate follows a change of model or load within seconds, not minutes.
SERVICE_EWMA_ALPHA = 0.2


class Scheduler(Protocol):
    """What the app needs from a queue in front of one upstream."""

    capacity: int

    # The queue owns the timeout (ASYNC109) rather than the caller's ``asyncio.timeout``:
    # giving up must take the ticket out and price a Retry-After from its position.
    async def acquire(self, *, team: str, weight: int = 1, timeout: float) -> Lease:  # noqa: ASYNC109
        """A slot for ``team``, waiting at most ``timeout`` seconds (else ``QueueFull``)."""
        ...

    async def depth(self) -> int:
        """Requests waiting for a slot."""
        ...

    async def in_use(self) -> int:
        """Slots held."""
        ...


class Lease:
    """One slot at the upstream, held until :meth:`release` (or ``async with`` exit).

    ``waited`` is the time spent queued (0.0 when granted at once). A lease garbage-
    collected without being released is released then, with a warning: a forgotten
    release must cost a slot for a moment, not for the life of the process.
    """

    __slots__ = ("__weakref__", "_finalizer", "_on_release", "_released", "team", "waited")

    def __init__(
        self, *, team: str, waited: float, on_release: Callable[[], Awaitable[None]]
    ) -> None:
        self.team = team
        self.waited = waited
        self._on_release = on_release
        self._released = False
        loop = asyncio.get_running_loop()
        self._finalizer = weakref.finalize(self, _release_abandoned, team, on_release, loop)
        self._finalizer.atexit = False

    @property
    def released(self) -> bool:
        return self._released

    async def release(self) -> None:
        """Free the slot and hand it to the next waiter. Safe to call more than once (and
        concurrently): only the first call frees anything."""
        if self._released:
            return
        self._released = True
        self._finalizer.detach()
        await self._on_release()

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<Lease team={self.team!r} waited={self.waited:.3f} {state}>"


_abandoned_releases: set[asyncio.Task[None]] = set()


def _release_abandoned(
    team: str, on_release: Callable[[], Awaitable[None]], loop: asyncio.AbstractEventLoop
) -> None:
    """Release a lease its holder dropped. The garbage collector may run this anywhere,
    even inside the scheduler's own bookkeeping, so it only schedules the release."""
    if loop.is_closed():
        return
    logger.warning("a lease of team %r was dropped without release; releasing it", team)

    def start() -> None:
        task = loop.create_task(_awaited(on_release))
        _abandoned_releases.add(task)
        task.add_done_callback(_abandoned_releases.discard)

    loop.call_soon_threadsafe(start)


async def _awaited(work: Callable[[], Awaitable[None]]) -> None:
    await work()


class FairQueue(Generic[T]):
    """Deficit round robin over teams, FIFO within a team; pure and deterministic.

    Every request costs one unit. Active teams form a ring; the team at its head serves
    up to its quantum (its ``weight``) of requests, then moves to the tail. A team whose
    queue empties leaves the ring and forgets its deficit, and rejoins at the tail, so a
    newcomer waits for at most one turn of each team ahead of it. The Lua scripts of
    :class:`RedisScheduler` implement exactly this; the contract tests hold both to it.
    """

    __slots__ = ("_deficit", "_queues", "_ring", "_team_of", "_weight")

    def __init__(self) -> None:
        self._queues: dict[str, deque[T]] = {}
        self._ring: deque[str] = deque()
        self._deficit: dict[str, int] = {}
        self._weight: dict[str, int] = {}
        self._team_of: dict[T, str] = {}

    def __len__(self) -> int:
        return len(self._team_of)

    def __contains__(self, item: object) -> bool:
        return item in self._team_of

    def push(self, team: str, item: T, *, weight: int = 1) -> None:
        """Queue ``item`` for ``team``; the team's quantum becomes ``weight`` (requests of
        one team normally share one weight, so the latest one wins)."""
        if weight < 1:
            raise ValueError(f"weight must be a positive integer, not {weight!r}")
        if item in self._team_of:
            raise ValueError(f"{item!r} is queued already")
        queue = self._queues.get(team)
        if queue is None:
            queue = self._queues[team] = deque()
            self._ring.append(team)
            self._deficit[team] = 0
        queue.append(item)
        self._weight[team] = weight
        self._team_of[item] = team

    def peek(self) -> T | None:
        """The item :meth:`pop` would return, without taking it."""
        if not self._ring:
            return None
        return self._queues[self._ring[0]][0]

    def pop(self) -> T | None:
        """The next item in fair order, or None when empty."""
        if not self._ring:
            return None
        team = self._ring[0]
        if self._deficit[team] <= 0:  # the start of this team's turn
            self._deficit[team] += self._weight[team]
        queue = self._queues[team]
        item = queue.popleft()
        del self._team_of[item]
        self._deficit[team] -= 1
        if not queue:
            self._retire(team)
        elif self._deficit[team] <= 0:
            self._ring.rotate(-1)
        return item

    def remove(self, item: T) -> bool:
        """Take ``item`` out wherever it is; False if it is not queued. Nobody else's turn
        is charged for it."""
        team = self._team_of.pop(item, None)
        if team is None:
            return False
        queue = self._queues[team]
        queue.remove(item)
        if not queue:
            self._retire(team)
        return True

    def ahead(self, item: T) -> int:
        """How many items :meth:`pop` would return before ``item`` (KeyError if absent).

        Replays the rounds on counters rather than items, so it costs O(answer + teams).
        """
        team = self._team_of[item]
        index = self._queues[team].index(item)
        return _ahead(
            ring=list(self._ring),
            lengths={t: len(q) for t, q in self._queues.items()},
            deficit=dict(self._deficit),
            weight=dict(self._weight),
            team=team,
            index=index,
        )

    def _retire(self, team: str) -> None:
        self._ring.remove(team)
        del self._queues[team], self._deficit[team], self._weight[team]


def _ahead(
    *,
    ring: list[str],
    lengths: dict[str, int],
    deficit: dict[str, int],
    weight: dict[str, int],
    team: str,
    index: int,
) -> int:
    order = deque(ring)
    served = 0
    while True:
        head = order[0]
        if deficit[head] <= 0:
            deficit[head] += weight[head]
        if head == team and index == 0:
            return served
        served += 1
        lengths[head] -= 1
        deficit[head] -= 1
        if head == team:
            index -= 1
        if lengths[head] == 0:
            order.popleft()
        elif deficit[head] <= 0:
            order.rotate(-1)


def estimated_retry_after(*, mean_service: float | None, position: int, capacity: int) -> float:
    """Seconds until the slot this waiter would have had is likely free: the ``position``
    requests ahead of it, and its own, drain ``capacity`` at a time."""
    mean = DEFAULT_SERVICE_SECONDS if mean_service is None else mean_service
    return float(max(1, math.ceil(mean * (position + 1) / capacity)))


def check_request(*, weight: int, timeout: float) -> None:
    if not isinstance(weight, int) or weight < 1:
        raise ValueError(f"weight must be a positive integer, not {weight!r}")
    if timeout < 0:
        raise ValueError(f"timeout must not be negative, not {timeout!r}")


def raise_if_cancelling() -> None:
    """Deliver a cancellation that was requested but swallowed on the way.

    redis-py sends each command under ``asyncio.wait_for``, which on Python 3.11 drops a
    cancellation that lands just as the send completes (bpo-42130, fixed in 3.12). A
    waiter that missed its client's disconnect would sit in the queue, and could take a
    slot, for nobody; the task's own count of pending cancellations still says so.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def check_capacity(capacity: int) -> None:
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, not {capacity!r}")
