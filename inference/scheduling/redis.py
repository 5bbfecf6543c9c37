"""The queue in Redis, shared by every web process: slots are leases that expire unless
renewed, so a crashed process gives its slots back by itself. A request granted at once
costs one Lua call (:mod:`inference.scheduling.lua` holds the scripts and the keys)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from inference.errors import QueueFull, SchedulerUnavailable
from inference.scheduling.lua import (
    CANCEL_SCRIPT,
    COUNT_SCRIPT,
    ENQUEUE_SCRIPT,
    POLL_SCRIPT,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
)
from inference.scheduling.queue import (
    SERVICE_EWMA_ALPHA,
    Lease,
    check_capacity,
    check_request,
    estimated_retry_after,
    raise_if_cancelling,
)

logger = logging.getLogger(__name__)

R = TypeVar("R")

# The first pause before resubscribing to wake-ups after a failure; it doubles with each
# failure in a row, up to ``poll_seconds`` (the waiters poll meanwhile anyway).
LISTEN_RETRY_SECONDS = 0.025

_GRANTED = 1  # from the enqueue and poll scripts: the ticket holds a lease
_WAS_GRANTED = 1  # first item from the cancel script: too late to withdraw, it holds a lease


@dataclass(slots=True, eq=False)
class _Sleeper:
    """A local waiter's mailbox, filled by the wake-up listener."""

    woken: asyncio.Event
    """Set when the ticket's grant was heard, or when the waiter should poll now."""
    granted: bool = False


class RedisScheduler:
    """The queue in Redis, shared by every process that uses the same ``name``.

    Each operation is one Lua script, atomic on the server. A waiter holds no connection:
    each instance keeps one pub/sub subscription (started with the first waiter, ended
    after ``lease_seconds`` without one, or by :meth:`aclose`), on which dispatch
    publishes every ticket of this instance it grants, so a release wakes the next waiter
    at once. Every ``poll_seconds`` a waiter re-runs dispatch instead, which reclaims
    leases whose holders died, keeps its own ticket alive (a ticket whose waiter stops
    polling lapses after ``lease_seconds``, so a crashed process's waiters cost no slot)
    and finds a grant whose wake-up was lost. A holder renews its lease every
    ``lease_seconds / 3`` until it releases.

    ``poll_seconds`` defaults to ``min(1, lease_seconds / 3)``. The instance uses at most
    its client pool's ``max_connections``: one for the subscription while anyone waits,
    the others for scripts, which wait for one another beyond that (so a pool of its own
    is best; ``max_connections`` must be at least 2). ``clock`` (seconds) is sent into the
    scripts, so tests can expire leases without sleeping; by default the scripts read
    Redis's own ``TIME``, one clock for every process.
    """

    def __init__(
        self,
        *,
        redis: redis.asyncio.Redis,
        name: str,
        capacity: int,
        lease_seconds: float = 30.0,
        key_prefix: str = "ragtier:queue:",
        clock: Callable[[], float] | None = None,
        poll_seconds: float | None = None,
    ) -> None:
        check_capacity(capacity)
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, not {lease_seconds!r}")
        poll = min(1.0, lease_seconds / 3) if poll_seconds is None else poll_seconds
        if not 0 < poll <= lease_seconds / 3:
            raise ValueError(f"poll_seconds must be in (0, lease_seconds / 3], not {poll!r}")
        self.capacity = capacity
        self.name = name
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll
        self._redis = redis
        self._clock = clock
        self._base = f"{key_prefix}{{{name}}}:"
        self._keys = [
            self._base + key
            for key in ("ring", "deficit", "weight", "waiting", "alive", "leases", "granted")
        ] + [self._base + "stats"]
        self._enqueue = redis.register_script(ENQUEUE_SCRIPT)
        self._poll = redis.register_script(POLL_SCRIPT)
        self._release = redis.register_script(RELEASE_SCRIPT)
        self._cancel = redis.register_script(CANCEL_SCRIPT)
        self._renew = redis.register_script(RENEW_SCRIPT)
        self._count = redis.register_script(COUNT_SCRIPT)
        self._background: set[asyncio.Future[Any]] = set()
        # Wake-ups: this instance's channel, its listener, and the local waiters by ticket.
        self._instance = uuid.uuid4().hex
        self._channel = f"{self._base}wake:{self._instance}"
        self._sleepers: dict[str, _Sleeper] = {}
        self._listener: asyncio.Task[None] | None = None
        self._listen_failures = 0
        # A pool that refuses past max_connections (redis-py's default) would fail a burst
        # of concurrent scripts; they queue here instead, leaving one for the listener.
        limit = getattr(getattr(redis, "connection_pool", None), "max_connections", None)
        self._commands = asyncio.Semaphore(max(1, limit - 1)) if isinstance(limit, int) else None

    async def acquire(self, *, team: str, weight: int = 1, timeout: float) -> Lease:  # noqa: ASYNC109
        check_request(weight=weight, timeout=timeout)
        ticket = f"{self._instance}:{uuid.uuid4().hex}"
        started = self._now_local()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # Listening before the ticket exists: its wake-up may arrive before the enqueue's
        # own reply does.
        sleeper = self._sleepers[ticket] = _Sleeper(woken=asyncio.Event())
        try:
            if await self._run(self._enqueue, ticket, team, weight) == _GRANTED:
                return self._lease(ticket, team, waited=0.0)
            self._start_listener()
            granted = await self._wait(ticket, sleeper, deadline=deadline)
        except BaseException:  # cancelled (client gone) or Redis failed
            await self._abandon(ticket)
            raise
        finally:
            del self._sleepers[ticket]
        if not granted:
            outcome = await self._shielded(self._withdraw(ticket))
            if outcome[0] != _WAS_GRANTED:  # else granted at the deadline: keep it
                mean = outcome[2] if len(outcome) > 2 else None
                raise QueueFull(
                    f"no slot for team {team!r} within {timeout:g}s",
                    retry_after=estimated_retry_after(
                        mean_service=float(mean) if mean is not None else None,
                        position=int(outcome[1]) if len(outcome) > 1 else 0,
                        capacity=self.capacity,
                    ),
                )
        return self._lease(ticket, team, waited=self._now_local() - started)

    async def depth(self) -> int:
        waiting, _ = await self._run(self._count)
        return int(waiting)

    async def in_use(self) -> int:
        _, held = await self._run(self._count)
        return int(held)

    async def aclose(self) -> None:
        """Stop listening for wake-ups, giving the subscription's connection back to the
        pool (the client itself stays open: it is the caller's). Waiters still queued
        go on by polling; the next one to queue starts listening again."""
        listener = self._listener
        if listener is not None:
            listener.cancel()
            await asyncio.wait({listener})  # it forgets itself once its connection is back

    async def _wait(self, ticket: str, sleeper: _Sleeper, *, deadline: float) -> bool:
        """True once dispatch has granted ``ticket``; False at the deadline."""
        loop = asyncio.get_running_loop()
        while (remaining := deadline - loop.time()) > 0:
            raise_if_cancelling()
            if not sleeper.woken.is_set():
                try:
                    async with asyncio.timeout(min(remaining, self.poll_seconds)):
                        await sleeper.woken.wait()
                except TimeoutError:
                    pass
            if sleeper.granted:
                return True
            # Cleared before the poll, so that a wake-up heard meanwhile is not lost.
            sleeper.woken.clear()
            if await self._run(self._poll, ticket) == _GRANTED:
                return True
        return False

    def _start_listener(self) -> None:
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name=f"queue {self.name} wake-ups"
            )

    async def _listen(self) -> None:
        """Hear this instance's grants until nobody has waited for ``lease_seconds``;
        resubscribe after a failure. Each (re)subscription lets every local waiter poll
        once, since the grants published while nobody listened are heard by nobody."""
        try:
            while True:
                failed = await self._listen_once()
                # Decided with no await before returning, so that a waiter queued from
                # now on finds no listener and starts one.
                if not self._sleepers:
                    self._listener = None
                    return
                if failed:  # the waiters poll meanwhile; retry soon, then less often
                    self._listen_failures += 1
                    backoff = LISTEN_RETRY_SECONDS * 2 ** min(self._listen_failures, 16)
                    await asyncio.sleep(min(self.poll_seconds, backoff))
        finally:
            if self._listener is asyncio.current_task():
                self._listener = None

    async def _listen_once(self) -> bool:
        """One subscription, until idle for a while (False) or failed (True)."""
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(self._channel)
            while True:
                message = await pubsub.get_message(timeout=self.poll_seconds)
                raise_if_cancelling()  # aclose() must stop it, whatever redis-py swallows
                if message is not None:
                    self._hear(message)
                if self._sleepers:
                    idle_since = loop.time()
                elif loop.time() - idle_since >= self.lease_seconds:
                    return False
        except Exception as exc:  # whatever broke, the waiters poll meanwhile
            logger.warning("queue %s: wake-up subscription failed: %r", self.name, exc)
            return True
        finally:
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            except Exception as exc:
                logger.debug("queue %s: closing the subscription failed: %r", self.name, exc)

    def _hear(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "subscribe":  # (re)subscribed: grants may have gone unheard meanwhile
            self._listen_failures = 0
            for sleeper in self._sleepers.values():
                sleeper.woken.set()
        elif kind == "message":
            data = message.get("data")
            ticket = data.decode() if isinstance(data, bytes) else str(data)
            waiter = self._sleepers.get(ticket)
            if waiter is not None:
                waiter.granted = True
                waiter.woken.set()

    async def _withdraw(self, ticket: str) -> list[Any]:
        return list(await self._run(self._cancel, ticket))

    async def _abandon(self, ticket: str) -> None:
        """Take back the ticket of a waiter that failed or was cancelled, releasing the
        lease if a grant won the race. Best effort: if Redis cannot be reached, the
        ticket lapses, and any lease expires, within ``lease_seconds``."""
        try:
            if (await self._shielded(self._withdraw(ticket)))[0] == _WAS_GRANTED:
                await self._shielded(self._run(self._release, ticket, SERVICE_EWMA_ALPHA))
        except SchedulerUnavailable:
            logger.warning("could not withdraw ticket %s of queue %s", ticket, self.name)

    def _lease(self, ticket: str, team: str, *, waited: float) -> Lease:
        renewal = asyncio.create_task(self._keep_alive(ticket), name=f"lease renewal {ticket}")

        async def release() -> None:
            renewal.cancel()
            try:
                await self._shielded(self._run(self._release, ticket, SERVICE_EWMA_ALPHA))
            except SchedulerUnavailable:
                # Raising here would mask whatever the holder is unwinding from; the lease
                # is no longer renewed, so Redis reclaims the slot within lease_seconds.
                logger.warning("could not release lease %s of queue %s", ticket, self.name)

        return Lease(team=team, waited=waited, on_release=release)

    async def _keep_alive(self, ticket: str) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                renewed = await self._run(self._renew, ticket)
            except SchedulerUnavailable:
                logger.warning("could not renew lease %s of queue %s", ticket, self.name)
                continue
            if not renewed:
                logger.warning("lease %s of queue %s lapsed before renewal", ticket, self.name)
                return

    async def _run(self, script: AsyncScript, *args: str | int | float) -> Any:
        if self._commands is None:
            return await self._call(script, *args)
        async with self._commands:  # never suspends while a connection is to spare
            return await self._call(script, *args)

    async def _call(self, script: AsyncScript, *args: str | int | float) -> Any:
        now = "" if self._clock is None else repr(float(self._clock()))
        argv: list[str | int | float] = [now, self.capacity, self.lease_seconds, self._base]
        try:
            return await script(keys=self._keys, args=[*argv, *args])
        except RedisError as exc:
            # Redis's text names its address: the log keeps it, the caller reads the kind.
            logger.warning("the queue's Redis failed: %r", exc)
            raise SchedulerUnavailable(f"Redis is unreachable ({type(exc).__name__}).") from exc

    async def _shielded(self, work: Coroutine[Any, Any, R]) -> R:
        """Run clean-up to the end even if the caller is cancelled again meanwhile."""
        return await asyncio.shield(self._track(asyncio.ensure_future(work)))

    def _track(self, task: asyncio.Future[R]) -> asyncio.Future[R]:
        """Hold a reference to work that may outlive its awaiter, and hear its failure."""
        self._background.add(task)
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self._background.discard(task)
        if task.cancelled() or (error := task.exception()) is None:
            return
        # Its awaiter was cancelled meanwhile and cannot hear about it any more.
        logger.warning("queue %s: background work failed: %r", self.name, error)

    def _now_local(self) -> float:
        return time.monotonic() if self._clock is None else self._clock()
