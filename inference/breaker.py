"""A circuit breaker per upstream, so that a dead or black-holed server stops costing each
request its connect or first-token timeout.

Closed, it counts consecutive failures; at ``failures`` it opens, and requests skip the
upstream (the app tries the next one, or the fallback alias). After ``cool_off`` seconds
it is half-open: one request is let through as a probe (claiming the probe re-arms the
cool-off, so exactly one passes per cool-off); its success closes the circuit, its
failure keeps it open for another cool-off.

The transitions are pure functions of a :class:`BreakerRecord` and the time
(:func:`admit`, :func:`succeeded`, :func:`failed`), so they are tested with any clock.
:class:`CircuitBreaker` applies them to a store: :class:`LocalBreakerStore` (this process)
or :class:`RedisBreakerStore` (shared by every process; an optimistic transaction per
change). A store that fails fails open: the breaker is an optimisation, never a reason to
refuse a request.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import redis.asyncio
from redis.exceptions import RedisError, WatchError

logger = logging.getLogger(__name__)

T = TypeVar("T")
Change = Callable[["BreakerRecord"], tuple["BreakerRecord", T]]


class CircuitState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failures: int = 3
    """Consecutive failures that open the circuit."""
    cool_off: float = 30.0
    """Seconds an open circuit waits before letting a probe through."""

    def __post_init__(self) -> None:
        if self.failures < 1 or self.cool_off <= 0:
            raise ValueError(f"a breaker needs failures >= 1 and cool_off > 0, not {self}")


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    failures: int = 0
    opened_at: float | None = None
    """When the circuit opened, or when the last probe was let through."""


def state_of(record: BreakerRecord, policy: BreakerPolicy, now: float) -> CircuitState:
    if record.opened_at is None:
        return CircuitState.CLOSED
    if now - record.opened_at >= policy.cool_off:
        return CircuitState.HALF_OPEN
    return CircuitState.OPEN


def admit(record: BreakerRecord, policy: BreakerPolicy, now: float) -> tuple[BreakerRecord, bool]:
    """Whether a request may go to the upstream; a half-open circuit admits one probe."""
    match state_of(record, policy, now):
        case CircuitState.CLOSED:
            return record, True
        case CircuitState.HALF_OPEN:
            return replace(record, opened_at=now), True
    return record, False


def succeeded(record: BreakerRecord) -> tuple[BreakerRecord, None]:
    return BreakerRecord(), None


def failed(record: BreakerRecord, policy: BreakerPolicy, now: float) -> tuple[BreakerRecord, None]:
    failures = record.failures + 1
    if record.opened_at is not None or failures >= policy.failures:
        return BreakerRecord(failures=failures, opened_at=now), None  # a failed probe re-opens
    return BreakerRecord(failures=failures), None


class BreakerStore(Protocol):
    async def read(self, upstream: str) -> BreakerRecord: ...

    async def update(self, upstream: str, change: Change[T]) -> T:
        """Apply ``change`` atomically to the upstream's record; its result."""
        ...


class LocalBreakerStore:
    """Records in this process, shared by its threads and event loops."""

    def __init__(self) -> None:
        self._records: dict[str, BreakerRecord] = {}
        self._lock = threading.Lock()

    async def read(self, upstream: str) -> BreakerRecord:
        return self._records.get(upstream, BreakerRecord())

    async def update(self, upstream: str, change: Change[T]) -> T:
        with self._lock:
            record, result = change(self._records.get(upstream, BreakerRecord()))
            self._records[upstream] = record
        return result


class RedisBreakerStore:
    """Records in Redis (one hash per upstream), changed with WATCH/MULTI so that two
    processes never both take the one probe of a half-open circuit."""

    def __init__(self, *, redis: redis.asyncio.Redis, key_prefix: str, ttl: float) -> None:
        self._redis = redis
        self._prefix = key_prefix
        self._ttl = max(1, int(ttl))

    def _key(self, upstream: str) -> str:
        return f"{self._prefix}breaker:{upstream}"

    @staticmethod
    def _decode(raw: Mapping[Any, Any]) -> BreakerRecord:
        opened = raw.get(b"opened_at")
        return BreakerRecord(
            failures=int(raw.get(b"failures", 0)),
            opened_at=float(opened) if opened else None,
        )

    async def read(self, upstream: str) -> BreakerRecord:
        return self._decode(await self._redis.hgetall(self._key(upstream)))

    async def update(self, upstream: str, change: Change[T]) -> T:
        key = self._key(upstream)
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    before = self._decode(await pipe.hgetall(key))
                    after, result = change(before)
                    if after == before:
                        await pipe.unwatch()  # type: ignore[no-untyped-call]
                        return result
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.delete(key)
                    opened = "" if after.opened_at is None else repr(after.opened_at)
                    pipe.hset(key, "failures", after.failures)
                    pipe.hset(key, "opened_at", opened)
                    pipe.expire(key, self._ttl)
                    await pipe.execute()
                    return result
                except WatchError:
                    continue


class CircuitBreaker:
    """The breakers of every upstream, over one store. ``clock``: seconds, the same for
    every process sharing the store (wall time by default).

    ``fresh_for``: seconds an upstream's record, read clean (no failure, circuit closed),
    is taken as still clean without reading the store again, unless this process records
    a failure meanwhile. With a shared store that is a round trip fewer before each first
    token (``allow``) and after it (``success``); a circuit another process opens is then
    seen here up to ``fresh_for`` later. 0 (the default): every question reads."""

    def __init__(
        self,
        *,
        store: BreakerStore,
        policy: BreakerPolicy,
        clock: Callable[[], float] = time.time,
        fresh_for: float = 0.0,
    ) -> None:
        self.store = store
        self.policy = policy
        self.fresh_for = fresh_for
        self._clock = clock
        self._clean_until: dict[str, float] = {}

    async def allow(self, upstream: str) -> bool:
        """Whether to send a request to ``upstream`` now (a half-open circuit: this one is
        its probe). A closed circuit costs one read (none while its clean record is
        fresh); only a probe takes a transaction."""
        if await self.state(upstream) is CircuitState.CLOSED:
            return True
        now = self._clock()
        return await self._safely(
            upstream, lambda record: admit(record, self.policy, now), default=True
        )

    async def success(self, upstream: str) -> None:
        """The upstream answered: its failures are forgotten (one read when there were
        none, as on nearly every answer; none while its clean record is fresh)."""
        if self._fresh(upstream):
            return
        try:
            clean = await self._read(upstream) == BreakerRecord()
        except RedisError as exc:
            logger.warning("circuit breaker store unreachable: %r", exc)
            return
        if not clean:
            await self._safely(upstream, succeeded, default=None)

    async def failure(self, upstream: str) -> None:
        self._clean_until.pop(upstream, None)
        now = self._clock()
        await self._safely(upstream, lambda r: failed(r, self.policy, now), default=None)

    async def state(self, upstream: str) -> CircuitState:
        if self._fresh(upstream):
            return CircuitState.CLOSED
        try:
            record = await self._read(upstream)
        except RedisError as exc:
            logger.warning("circuit breaker store unreachable: %r", exc)
            return CircuitState.CLOSED
        return state_of(record, self.policy, self._clock())

    async def _read(self, upstream: str) -> BreakerRecord:
        """The store's record, remembered as clean for ``fresh_for`` when it is."""
        record = await self.store.read(upstream)
        if self.fresh_for > 0 and record == BreakerRecord():
            self._clean_until[upstream] = self._clock() + self.fresh_for
        else:
            self._clean_until.pop(upstream, None)
        return record

    def _fresh(self, upstream: str) -> bool:
        return self._clean_until.get(upstream, -math.inf) > self._clock()

    async def _safely(self, upstream: str, change: Change[T], *, default: T) -> T:
        try:
            return await self.store.update(upstream, change)
        except RedisError as exc:
            logger.warning("circuit breaker store unreachable, failing open: %r", exc)
            return default
