"""The circuit breaker: pure transitions under an injected clock, and both stores."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest

from inference import (
    BreakerPolicy,
    CircuitBreaker,
    CircuitState,
    LocalBreakerStore,
    RedisBreakerStore,
)
from inference.breaker import BreakerRecord, admit, failed, state_of, succeeded

POLICY = BreakerPolicy(failures=3, cool_off=10.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_failures_open_it_and_a_success_in_between_resets_the_count() -> None:
    record = BreakerRecord()
    for _ in range(2):
        record, _ = failed(record, POLICY, 0.0)
    assert state_of(record, POLICY, 0.0) is CircuitState.CLOSED
    record, _ = succeeded(record)
    record, _ = failed(record, POLICY, 0.0)
    record, _ = failed(record, POLICY, 0.0)
    assert state_of(record, POLICY, 0.0) is CircuitState.CLOSED
    record, _ = failed(record, POLICY, 1.0)
    assert state_of(record, POLICY, 1.0) is CircuitState.OPEN
    assert admit(record, POLICY, 10.9) == (record, False)


def test_half_open_lets_one_probe_through_per_cool_off() -> None:
    record = BreakerRecord(failures=3, opened_at=0.0)
    assert state_of(record, POLICY, 10.0) is CircuitState.HALF_OPEN
    record, allowed = admit(record, POLICY, 10.0)
    assert allowed and state_of(record, POLICY, 10.0) is CircuitState.OPEN
    assert admit(record, POLICY, 15.0)[1] is False  # the probe is in flight
    failed_probe, _ = failed(record, POLICY, 12.0)
    assert state_of(failed_probe, POLICY, 21.0) is CircuitState.OPEN  # another cool-off
    assert state_of(failed_probe, POLICY, 22.0) is CircuitState.HALF_OPEN
    closed, _ = succeeded(record)
    assert closed == BreakerRecord()


def test_a_policy_must_be_sane() -> None:
    with pytest.raises(ValueError, match="failures >= 1"):
        BreakerPolicy(failures=0)


async def exercise(breaker: CircuitBreaker, clock: Clock) -> None:
    url = "http://upstream/v1"
    assert await breaker.state(url) is CircuitState.CLOSED
    for _ in range(3):
        assert await breaker.allow(url)
        await breaker.failure(url)
    assert await breaker.state(url) is CircuitState.OPEN
    assert not await breaker.allow(url)
    assert await breaker.allow("http://other/v1")  # each upstream has its own
    clock.now += 10
    assert await breaker.state(url) is CircuitState.HALF_OPEN
    assert await breaker.allow(url)  # the probe
    assert not await breaker.allow(url)  # only one
    await breaker.success(url)
    assert await breaker.state(url) is CircuitState.CLOSED
    assert await breaker.allow(url)


async def test_local_store() -> None:
    clock = Clock()
    await exercise(CircuitBreaker(store=LocalBreakerStore(), policy=POLICY, clock=clock), clock)


@pytest.fixture
async def redis_store() -> AsyncIterator[RedisBreakerStore]:
    import redis.asyncio
    from redis.exceptions import RedisError

    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("REDIS_URL is not set")
    client = redis.asyncio.Redis.from_url(url)
    try:
        await client.ping()
    except RedisError:
        await client.aclose()
        pytest.skip("Redis is not reachable")
    prefix = f"ragtier:test:{uuid.uuid4().hex}:"
    yield RedisBreakerStore(redis=client, key_prefix=prefix, ttl=60)
    keys = [key async for key in client.scan_iter(f"{prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def test_redis_store_shares_state_and_grants_one_probe(
    redis_store: RedisBreakerStore,
) -> None:
    clock = Clock()
    await exercise(CircuitBreaker(store=redis_store, policy=POLICY, clock=clock), clock)
    # Another process (another breaker on the same keys) sees the same circuit.
    other = CircuitBreaker(store=redis_store, policy=POLICY, clock=clock)
    first = CircuitBreaker(store=redis_store, policy=POLICY, clock=clock)
    for _ in range(3):
        await first.failure("http://shared/v1")
    assert await other.state("http://shared/v1") is CircuitState.OPEN


async def test_an_unreachable_store_fails_open() -> None:
    import redis.asyncio

    client = redis.asyncio.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    breaker = CircuitBreaker(
        store=RedisBreakerStore(redis=client, key_prefix="x:", ttl=60), policy=POLICY
    )
    assert await breaker.allow("http://u/v1")
    await breaker.failure("http://u/v1")
    assert await breaker.state("http://u/v1") is CircuitState.CLOSED
    await client.aclose()


class CountingStore(LocalBreakerStore):
    """The local store, counting reads (each would be a round trip to Redis)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read(self, upstream: str) -> BreakerRecord:
        self.reads += 1
        return await super().read(upstream)


async def test_a_clean_record_is_trusted_while_fresh_and_a_failure_seen_after() -> None:
    clock, store = Clock(), CountingStore()
    here = CircuitBreaker(store=store, policy=POLICY, clock=clock, fresh_for=1.0)
    elsewhere = CircuitBreaker(store=store, policy=POLICY, clock=clock)  # another process
    upstream = "http://u/v1"
    assert await here.allow(upstream)
    for _ in range(5):  # the answers of the next second: no read before or after them
        assert await here.allow(upstream)
        await here.success(upstream)
    assert store.reads == 1
    for _ in range(3):
        await elsewhere.failure(upstream)
    assert await here.allow(upstream)  # opened elsewhere, not seen here yet
    clock.now += 1.0
    assert await here.state(upstream) is CircuitState.OPEN  # ... and seen once stale
    assert not await here.allow(upstream)


async def test_a_failure_here_is_seen_here_at_once() -> None:
    clock, store = Clock(), CountingStore()
    breaker = CircuitBreaker(
        store=store, policy=BreakerPolicy(failures=1, cool_off=10.0), clock=clock, fresh_for=60.0
    )
    assert await breaker.allow("http://u/v1")
    await breaker.failure("http://u/v1")
    assert await breaker.state("http://u/v1") is CircuitState.OPEN
    reads = store.reads
    assert await breaker.state("http://u/v1") is CircuitState.OPEN
    assert store.reads == reads + 1  # a record with failures is never taken as fresh
