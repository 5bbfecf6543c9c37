"""The queue inside one process (asyncio), for the embedded default of a single web
process. A request granted at once costs no task switch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from inference.errors import QueueFull
from inference.scheduling.queue import (
    SERVICE_EWMA_ALPHA,
    FairQueue,
    Lease,
    check_capacity,
    check_request,
    estimated_retry_after,
)


@dataclass(slots=True, eq=False)
class _Waiter:
    team: str
    enqueued: float
    granted: asyncio.Future[float]
    """Resolved with the grant time by dispatch; cancelled when the waiter gives up."""

    @property
    def gone(self) -> bool:
        return self.granted.done()


@dataclass(slots=True)
class _Ewma:
    alpha: float = SERVICE_EWMA_ALPHA
    mean: float | None = None

    def add(self, sample: float) -> None:
        sample = max(0.0, sample)
        self.mean = sample if self.mean is None else self.mean + self.alpha * (sample - self.mean)


class LocalScheduler:
    """The queue inside one process, on one event loop (its futures belong to the loop
    that awaits them). Every state change is synchronous, so there is nothing to lock."""

    def __init__(self, *, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        check_capacity(capacity)
        self.capacity = capacity
        self._clock = clock
        self._held = 0
        self._queue: FairQueue[_Waiter] = FairQueue()
        self._service = _Ewma()

    async def acquire(self, *, team: str, weight: int = 1, timeout: float) -> Lease:  # noqa: ASYNC109
        check_request(weight=weight, timeout=timeout)
        if self._held < self.capacity and not self._queue:
            # The fast path: no await, hence no task switch.
            self._held += 1
            return self._lease(team, granted_at=self._clock(), waited=0.0)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(team=team, enqueued=self._clock(), granted=loop.create_future())
        self._queue.push(team, waiter, weight=weight)
        # The queue may have held only waiters cancelled a moment ago, hiding a free slot.
        self._dispatch()
        try:
            async with asyncio.timeout(timeout):
                granted_at = await waiter.granted
        except TimeoutError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                granted_at = waiter.granted.result()  # granted at the deadline: keep it
            else:
                position = self._queue.ahead(waiter) if waiter in self._queue else 0
                self._queue.remove(waiter)
                raise QueueFull(
                    f"no slot for team {team!r} within {timeout:g}s",
                    retry_after=estimated_retry_after(
                        mean_service=self._service.mean,
                        position=position,
                        capacity=self.capacity,
                    ),
                ) from None
        except BaseException:  # cancelled: the client went away while queued
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._free(granted_at=waiter.granted.result())  # the grant won the race
            else:
                self._queue.remove(waiter)
                waiter.granted.cancel()
            raise
        return self._lease(team, granted_at=granted_at, waited=granted_at - waiter.enqueued)

    async def depth(self) -> int:
        return len(self._queue)

    async def in_use(self) -> int:
        return self._held

    def _lease(self, team: str, *, granted_at: float, waited: float) -> Lease:
        async def release() -> None:
            self._free(granted_at=granted_at)

        return Lease(team=team, waited=waited, on_release=release)

    def _free(self, *, granted_at: float) -> None:
        self._held -= 1
        self._service.add(self._clock() - granted_at)
        self._dispatch()

    def _dispatch(self) -> None:
        while self._held < self.capacity:
            waiter = self._queue.peek()
            if waiter is None:
                return
            if waiter.gone:  # cancelled, its task not yet resumed to take itself out
                self._queue.remove(waiter)
                continue
            self._queue.pop()
            self._held += 1
            waiter.granted.set_result(self._clock())
