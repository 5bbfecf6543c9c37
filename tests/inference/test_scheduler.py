"""The fair queue in front of an upstream: one contract, held by both implementations
(in process and in real Redis), plus the pure round-robin arithmetic on its own."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from inference import (
    FairQueue,
    Lease,
    LocalScheduler,
    QueueFull,
    RedisScheduler,
    Scheduler,
    SchedulerUnavailable,
)
from tests.conftest import free_port, reachable_redis_url


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


MakeScheduler = Callable[..., Scheduler]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def key_prefix() -> str:
    return f"ragtier:test:{uuid.uuid4().hex[:12]}:"


@pytest.fixture
async def redis_clients(key_prefix: str) -> AsyncIterator[Callable[..., redis.asyncio.Redis]]:
    """Fresh clients (one per simulated process) on the test Redis, with the client
    options given; this test's keys are deleted afterwards."""
    url = reachable_redis_url()
    clients: list[redis.asyncio.Redis] = []

    def connect(**options: Any) -> redis.asyncio.Redis:
        clients.append(redis.asyncio.Redis.from_url(url, **options))
        return clients[-1]

    yield connect
    if clients:
        async for key in clients[0].scan_iter(match=key_prefix + "*"):
            await clients[0].delete(key)
    for client in clients:
        await client.aclose()


@pytest.fixture
async def make_redis(
    redis_clients: Callable[..., redis.asyncio.Redis], clock: FakeClock, key_prefix: str
) -> AsyncIterator[Callable[..., RedisScheduler]]:
    """A RedisScheduler factory: each call is another process (its own client, unless
    ``redis=`` names one) on the same queue, under a key prefix of this test's own. Each
    is closed (its wake-up listener stopped) after the test."""
    schedulers: list[RedisScheduler] = []

    def make(capacity: int = 1, **options: Any) -> RedisScheduler:
        options.setdefault("clock", clock)
        if "redis" not in options:
            options["redis"] = redis_clients()
        schedulers.append(
            RedisScheduler(name="upstream", capacity=capacity, key_prefix=key_prefix, **options)
        )
        return schedulers[-1]

    yield make
    for scheduler in schedulers:
        await scheduler.aclose()


@pytest.fixture(params=["local", "redis"])
def make(request: Any, clock: FakeClock) -> MakeScheduler:
    """One scheduler per test, in process then in real Redis (skipped when absent)."""
    if request.param == "redis":
        make_redis: Callable[..., RedisScheduler] = request.getfixturevalue("make_redis")
        return lambda capacity=1: make_redis(capacity)
    return lambda capacity=1: LocalScheduler(capacity=capacity, clock=clock)


async def until(condition: Callable[[], Awaitable[bool]]) -> None:
    """Poll: the state lives in Redis for one of the schedulers, so there is no event."""
    async with asyncio.timeout(2):
        while not await condition():  # noqa: ASYNC110
            await asyncio.sleep(0.002)


async def queue_up(
    scheduler: Scheduler, team: str, label: str, order: list[str], weight: int = 1
) -> asyncio.Task[None]:
    """Start a request that records its grant and releases at once; returns once it is
    queued, so requests enter in the order this is called."""

    async def request() -> None:
        lease = await scheduler.acquire(team=team, weight=weight, timeout=5)
        order.append(label)
        await lease.release()

    waiting = await scheduler.depth()
    task = asyncio.create_task(request())
    await until(lambda: _depth_is(scheduler, waiting + 1))
    return task


async def _depth_is(scheduler: Scheduler, n: int) -> bool:
    return await scheduler.depth() == n


async def _in_use_is(scheduler: Scheduler, n: int) -> bool:
    return await scheduler.in_use() == n


# --------------------------------------------------------------------------------------
# The contract, for both schedulers


async def test_grants_at_once_up_to_capacity_then_queues(make: MakeScheduler) -> None:
    scheduler = make(capacity=2)
    first = await scheduler.acquire(team="a", timeout=1)
    second = await scheduler.acquire(team="b", timeout=1)
    assert (first.team, first.waited, second.waited) == ("a", 0.0, 0.0)
    assert await scheduler.in_use() == 2
    with pytest.raises(QueueFull):
        await scheduler.acquire(team="c", timeout=0.02)
    await first.release()
    await second.release()
    assert (await scheduler.in_use(), await scheduler.depth()) == (0, 0)


async def test_a_newcomer_waits_at_most_one_more_request_of_a_backlogged_team(
    make: MakeScheduler,
) -> None:
    scheduler = make(capacity=1)
    busy = await scheduler.acquire(team="a", timeout=1)
    order: list[str] = []
    tasks = [await queue_up(scheduler, "a", f"a{i}", order) for i in range(1, 6)]
    tasks.append(await queue_up(scheduler, "b", "b1", order))

    await busy.release()
    await asyncio.gather(*tasks)

    assert order == ["a1", "b1", "a2", "a3", "a4", "a5"]
    assert (await scheduler.in_use(), await scheduler.depth()) == (0, 0)


async def test_weights_interleave_grants_while_both_teams_are_backlogged(
    make: MakeScheduler,
) -> None:
    scheduler = make(capacity=1)
    busy = await scheduler.acquire(team="x", timeout=1)
    order: list[str] = []
    tasks = [await queue_up(scheduler, "a", f"a{i}", order, weight=3) for i in range(1, 9)]
    tasks += [await queue_up(scheduler, "b", f"b{i}", order) for i in range(1, 5)]

    await busy.release()
    await asyncio.gather(*tasks)

    assert order == ["a1", "a2", "a3", "b1", "a4", "a5", "a6", "b2", "a7", "a8", "b3", "b4"]


async def test_timeout_raises_queue_full_with_the_default_estimate_and_leaves_the_queue(
    make: MakeScheduler,
) -> None:
    scheduler = make(capacity=1)
    busy = await scheduler.acquire(team="a", timeout=1)
    with pytest.raises(QueueFull) as caught:
        await scheduler.acquire(team="b", timeout=0.02)
    # No lease has been released yet: the 5 s default service time, nobody ahead.
    assert (caught.value.code, caught.value.status, caught.value.retry_after) == (
        "queue_full",
        503,
        5.0,
    )
    assert await scheduler.depth() == 0
    await busy.release()
    assert await scheduler.in_use() == 0


async def test_retry_after_follows_the_measured_service_time_and_the_fair_position(
    make: MakeScheduler, clock: FakeClock
) -> None:
    scheduler = make(capacity=1)
    measured = await scheduler.acquire(team="a", timeout=1)
    clock.advance(2.0)
    await measured.release()  # the first measurement: 2 s per request

    busy = await scheduler.acquire(team="a", timeout=1)
    order: list[str] = []
    tasks = [await queue_up(scheduler, "a", f"a{i}", order) for i in range(3)]
    with pytest.raises(QueueFull) as caught:
        await scheduler.acquire(team="b", timeout=0.02)
    # Three of team a wait, but fair order would have served b second: 2 s x (1 + 1).
    assert caught.value.retry_after == 4.0
    assert await scheduler.depth() == 3

    await busy.release()
    await asyncio.gather(*tasks)


async def test_waited_counts_the_time_spent_queued(make: MakeScheduler, clock: FakeClock) -> None:
    scheduler = make(capacity=1)
    busy = await scheduler.acquire(team="a", timeout=1)
    waiter = asyncio.create_task(scheduler.acquire(team="b", timeout=5))
    await until(lambda: _depth_is(scheduler, 1))
    clock.advance(3.0)
    await busy.release()
    lease = await waiter
    assert (lease.team, lease.waited) == ("b", 3.0)
    await lease.release()


async def test_a_cancelled_waiter_leaves_the_queue_and_never_holds_a_slot(
    make: MakeScheduler,
) -> None:
    scheduler = make(capacity=1)
    busy = await scheduler.acquire(team="a", timeout=1)
    waiter = asyncio.create_task(scheduler.acquire(team="b", timeout=5))
    await until(lambda: _depth_is(scheduler, 1))

    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await scheduler.depth() == 0

    await busy.release()
    assert await scheduler.in_use() == 0
    later = await scheduler.acquire(team="c", timeout=1)  # the slot is really free
    assert later.waited == 0.0
    await later.release()


async def test_a_grant_racing_a_cancel_gives_the_slot_back(
    make: MakeScheduler, request: Any
) -> None:
    scheduler = make(capacity=1)
    busy = await scheduler.acquire(team="a", timeout=1)
    waiter = asyncio.create_task(scheduler.acquire(team="b", timeout=5))
    await until(lambda: _depth_is(scheduler, 1))

    await busy.release()  # grants the waiter...
    waiter.cancel()  # ...whose client leaves before its task has run again
    try:
        lease = await waiter
    except asyncio.CancelledError:
        pass
    else:  # Redis only: the waiter may have woken during the release's round trip
        assert isinstance(scheduler, RedisScheduler)
        await lease.release()
    if isinstance(scheduler, LocalScheduler):
        assert waiter.cancelled()

    assert (await scheduler.in_use(), await scheduler.depth()) == (0, 0)


async def test_release_is_idempotent(make: MakeScheduler) -> None:
    scheduler = make(capacity=1)
    first = await scheduler.acquire(team="a", timeout=1)
    waiter = asyncio.create_task(scheduler.acquire(team="b", timeout=5))
    await until(lambda: _depth_is(scheduler, 1))

    await first.release()
    second = await waiter
    await first.release()  # must not free the slot the waiter now holds
    assert first.released
    assert await scheduler.in_use() == 1
    with pytest.raises(QueueFull):
        await scheduler.acquire(team="c", timeout=0.02)

    async with second:
        pass
    await second.release()
    assert await scheduler.in_use() == 0


async def test_capacity_is_never_exceeded_by_fifty_concurrent_requests(
    make: MakeScheduler,
) -> None:
    scheduler = make(capacity=3)
    holding = peak = 0

    async def request(i: int) -> None:
        nonlocal holding, peak
        async with await scheduler.acquire(team=f"team{i % 4}", weight=1 + i % 2, timeout=10):
            holding += 1
            peak = max(peak, holding)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            holding -= 1

    await asyncio.gather(*(request(i) for i in range(50)))

    assert peak == 3
    assert (await scheduler.in_use(), await scheduler.depth()) == (0, 0)


async def test_a_lease_dropped_without_release_is_released(
    make: MakeScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = make(capacity=1)
    lease: Lease | None = await scheduler.acquire(team="careless", timeout=1)
    assert await scheduler.in_use() == 1
    del lease
    gc.collect()
    await until(lambda: _in_use_is(scheduler, 0))
    assert "dropped without release" in caplog.text


async def test_arguments_are_checked(make: MakeScheduler) -> None:
    scheduler = make(capacity=1)
    with pytest.raises(ValueError, match="weight"):
        await scheduler.acquire(team="a", weight=0, timeout=1)
    with pytest.raises(ValueError, match="timeout"):
        await scheduler.acquire(team="a", timeout=-1)
    with pytest.raises(ValueError, match="capacity"):
        LocalScheduler(capacity=0)
    assert await scheduler.in_use() == 0


# --------------------------------------------------------------------------------------
# In process


async def test_local_fast_path_completes_without_suspending() -> None:
    scheduler = LocalScheduler(capacity=1)
    acquiring = scheduler.acquire(team="a", timeout=1)
    with pytest.raises(StopIteration) as done:
        acquiring.send(None)  # a coroutine that never awaits finishes on its first step
    lease = done.value.value
    assert isinstance(lease, Lease)
    releasing = lease.release()
    with pytest.raises(StopIteration):
        releasing.send(None)


# --------------------------------------------------------------------------------------
# In Redis


class CountingRedis(redis.asyncio.Redis):
    commands: list[str]

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.commands.append(str(args[0]))
        return await super().execute_command(*args, **options)


async def test_redis_fast_path_is_one_script_call(
    redis_clients: Callable[..., redis.asyncio.Redis], key_prefix: str
) -> None:
    counting = CountingRedis(connection_pool=redis_clients().connection_pool)
    counting.commands = []
    scheduler = RedisScheduler(redis=counting, name="upstream", capacity=1, key_prefix=key_prefix)
    await (await scheduler.acquire(team="a", timeout=1)).release()  # loads the scripts

    counting.commands.clear()
    lease = await scheduler.acquire(team="a", timeout=1)
    assert counting.commands == ["EVALSHA"]
    await lease.release()


async def test_a_crashed_holders_lease_is_reclaimed_once_it_expires(
    make_redis: Callable[..., RedisScheduler], clock: FakeClock
) -> None:
    crashed, alive = make_redis(capacity=1), make_redis(capacity=1)
    orphan = await crashed.acquire(team="a", timeout=1)  # never renewed nor released
    with pytest.raises(QueueFull):
        await alive.acquire(team="b", timeout=0.02)

    clock.advance(crashed.lease_seconds + 0.001)
    lease = await alive.acquire(team="b", timeout=1)
    assert lease.waited == 0.0

    await orphan.release()  # the late release of a reclaimed lease frees nobody's slot
    assert await alive.in_use() == 1
    await lease.release()
    assert await alive.in_use() == 0


async def test_a_blocked_waiter_takes_over_an_expired_lease(
    make_redis: Callable[..., RedisScheduler], clock: FakeClock
) -> None:
    crashed, alive = make_redis(capacity=1), make_redis(capacity=1, poll_seconds=0.02)
    orphan = await crashed.acquire(team="a", timeout=1)
    waiter = asyncio.create_task(alive.acquire(team="b", timeout=2))
    await until(lambda: _depth_is(alive, 1))

    clock.advance(crashed.lease_seconds + 1)
    lease = await waiter
    assert await alive.in_use() == 1
    await lease.release()
    await orphan.release()


async def test_a_crashed_waiters_ticket_lapses_instead_of_taking_a_slot(
    make_redis: Callable[..., RedisScheduler], clock: FakeClock
) -> None:
    crashed, alive = make_redis(capacity=1), make_redis(capacity=1, poll_seconds=0.02)
    busy = await alive.acquire(team="x", timeout=1)
    # A process that queued a ticket and died: the enqueue script, and nothing after it.
    assert await crashed._run(crashed._enqueue, "dead-ticket", "a", 1) == 0
    waiter = asyncio.create_task(alive.acquire(team="b", timeout=1))
    await until(lambda: _depth_is(alive, 2))

    # Both the holder's lease and the dead ticket lapse; only the live waiter polled.
    clock.advance(alive.lease_seconds + 1)
    lease = await waiter
    assert (await alive.in_use(), await alive.depth()) == (1, 0)
    await lease.release()
    await busy.release()


async def test_a_holder_renews_its_lease_while_it_works(
    make_redis: Callable[..., RedisScheduler],
) -> None:
    # Redis's own clock, short leases: without renewal the lease would lapse at 0.45 s
    # and the second request would be granted before its 0.7 s timeout.
    holder = make_redis(capacity=1, clock=None, lease_seconds=0.45, poll_seconds=0.05)
    other = make_redis(capacity=1, clock=None, lease_seconds=0.45, poll_seconds=0.05)
    lease = await holder.acquire(team="a", timeout=1)
    with pytest.raises(QueueFull):
        await other.acquire(team="b", timeout=0.7)
    assert await other.in_use() == 1
    await lease.release()
    assert await other.in_use() == 0


async def test_two_processes_share_one_capacity(
    make_redis: Callable[..., RedisScheduler],
) -> None:
    processes = [make_redis(capacity=2), make_redis(capacity=2)]
    holding = peak = 0

    async def request(i: int) -> None:
        nonlocal holding, peak
        lease = await processes[i % 2].acquire(team=f"team{i % 3}", timeout=10)
        holding += 1
        peak = max(peak, holding)
        await asyncio.sleep(0.001)
        holding -= 1
        await lease.release()

    await asyncio.gather(*(request(i) for i in range(50)))
    assert peak == 2

    # A release in one process wakes a waiter of the other.
    first, second = processes
    held = [await first.acquire(team="a", timeout=1) for _ in range(2)]
    waiter = asyncio.create_task(second.acquire(team="b", timeout=5))
    await until(lambda: _depth_is(second, 1))
    await held[0].release()
    lease = await waiter
    assert await first.in_use() == 2
    await lease.release()
    await held[1].release()
    assert await second.in_use() == 0


@contextlib.asynccontextmanager
async def peak_connections(client: redis.asyncio.Redis) -> AsyncIterator[list[int]]:
    """The most connections of ``client``'s pool in use at once while inside (sampled at
    every turn of the event loop; redis-py offers no public count)."""
    pool = client.connection_pool
    peak = [0]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], len(pool._in_use_connections))  # type: ignore[attr-defined]
            await asyncio.sleep(0)

    sampler = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        sampler.cancel()


async def test_two_hundred_waiters_share_a_pool_of_five_connections_in_fifo_order(
    make_redis: Callable[..., RedisScheduler], redis_clients: Callable[..., redis.asyncio.Redis]
) -> None:
    # redis-py's pool raises "Too many connections" past max_connections: a connection
    # per waiter would fail all but a handful of these with SchedulerUnavailable.
    client = redis_clients(max_connections=5)
    scheduler = make_redis(capacity=1, redis=client)
    busy = await scheduler.acquire(team="x", timeout=1)
    order: list[int] = []

    async def request(i: int) -> None:
        lease = await scheduler.acquire(team="a", timeout=10)
        order.append(i)
        await lease.release()

    async with peak_connections(client) as peak:
        tasks = []
        for i in range(200):  # all queued at once, in a known order
            tasks.append(asyncio.create_task(request(i)))
            while await scheduler.depth() <= i:  # noqa: ASYNC110
                await asyncio.sleep(0)
        await busy.release()
        await asyncio.gather(*tasks)

    assert order == list(range(200))
    assert peak[0] <= 5
    assert (await scheduler.in_use(), await scheduler.depth()) == (0, 0)


async def test_a_burst_of_two_hundred_requests_on_five_connections_all_get_a_slot(
    make_redis: Callable[..., RedisScheduler], redis_clients: Callable[..., redis.asyncio.Redis]
) -> None:
    client = redis_clients(max_connections=5)
    scheduler = make_redis(capacity=1, redis=client)
    holding = most = served = 0

    async def request(i: int) -> None:
        nonlocal holding, most, served
        async with await scheduler.acquire(team=f"team{i % 3}", timeout=10):
            holding += 1
            most = max(most, holding)
            await asyncio.sleep(0)
            holding -= 1
            served += 1

    async with peak_connections(client) as peak:
        await asyncio.gather(*(request(i) for i in range(200)))  # scripts at once, too

    assert (served, most) == (200, 1)
    assert peak[0] <= 5
    assert (await scheduler.in_use(), await scheduler.depth()) == (0, 0)


async def test_a_grant_whose_wake_up_nobody_hears_is_found_by_polling(
    make_redis: Callable[..., RedisScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = make_redis(capacity=1)
    deaf = make_redis(capacity=1, poll_seconds=0.02)
    monkeypatch.setattr(deaf, "_start_listener", lambda: None)  # its channel: unheard
    busy = await holder.acquire(team="a", timeout=1)
    waiter = asyncio.create_task(deaf.acquire(team="b", timeout=2))
    await until(lambda: _depth_is(deaf, 1))

    await busy.release()  # publishes the grant to nobody
    lease = await waiter
    assert await deaf.in_use() == 1
    await lease.release()


async def _subscribers_are(client: redis.asyncio.Redis, scheduler: RedisScheduler, n: int) -> bool:
    [(_, count)] = await client.pubsub_numsub(scheduler._channel)
    return bool(count == n)


async def test_the_wake_up_listener_resubscribes_after_its_connection_drops(
    make_redis: Callable[..., RedisScheduler], redis_clients: Callable[..., redis.asyncio.Redis]
) -> None:
    name = f"ragtier-test-{uuid.uuid4().hex[:12]}"
    admin, holder = redis_clients(), make_redis(capacity=1)
    # Polling only every 5 s: a waiter served within a second was woken, not polled.
    waiting = make_redis(capacity=1, poll_seconds=5, redis=redis_clients(client_name=name))
    busy = await holder.acquire(team="a", timeout=1)
    first = asyncio.create_task(waiting.acquire(team="b", timeout=5))
    await until(lambda: _depth_is(waiting, 1))
    second = asyncio.create_task(waiting.acquire(team="c", timeout=5))
    await until(lambda: _depth_is(waiting, 2))
    await until(lambda: _subscribers_are(admin, waiting, 1))

    [listener] = [c for c in await admin.client_list(_type="pubsub") if c["name"] == name]
    await admin.client_kill_filter(_id=listener["id"])
    await busy.release()  # published while nobody listens, or just after
    async with asyncio.timeout(1):
        lease = await first
    await until(lambda: _subscribers_are(admin, waiting, 1))  # back, for the second

    await lease.release()
    async with asyncio.timeout(1):
        await (await second).release()

    await waiting.aclose()
    await until(lambda: _subscribers_are(admin, waiting, 0))


async def test_an_unreachable_redis_fails_closed() -> None:
    no_retry = Retry(NoBackoff(), retries=0)
    client = redis.asyncio.Redis(port=free_port(), socket_connect_timeout=0.5, retry=no_retry)
    scheduler = RedisScheduler(redis=client, name="upstream", capacity=1)
    with pytest.raises(SchedulerUnavailable) as caught:
        await scheduler.acquire(team="a", timeout=1)
    assert (caught.value.code, caught.value.status) == ("rate_limiter_unavailable", 503)
    await client.aclose()


# --------------------------------------------------------------------------------------
# Deficit round robin, without asyncio


def drain(queue: FairQueue[str]) -> list[str]:
    popped = []
    while (item := queue.pop()) is not None:
        popped.append(item)
    return popped


def test_fair_queue_serves_each_team_its_weight_per_round() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(1, 5):
        queue.push("a", f"a{i}", weight=2)
    for i in range(1, 3):
        queue.push("b", f"b{i}")
    queue.push("c", "c1")
    assert queue.peek() == "a1"
    assert drain(queue) == ["a1", "a2", "b1", "c1", "a3", "a4", "b2"]
    assert len(queue) == 0
    assert queue.peek() is None


def test_fair_queue_remove_charges_nobody() -> None:
    queue: FairQueue[str] = FairQueue()
    for item in ("a1", "a2", "b1", "b2"):
        queue.push(item[0], item)
    assert queue.remove("a1")
    assert not queue.remove("a1")
    assert "a1" not in queue
    assert queue.remove("b1") and queue.remove("b2")  # team b leaves the ring
    queue.push("c", "c1")
    assert drain(queue) == ["a2", "c1"]


def test_fair_queue_refuses_duplicates_and_bad_weights() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("a", "x")
    with pytest.raises(ValueError, match="already"):
        queue.push("b", "x")
    with pytest.raises(ValueError, match="weight"):
        queue.push("a", "y", weight=0)
    with pytest.raises(KeyError):
        queue.ahead("y")


operations = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from("abcd"), st.integers(1, 3)),
        st.tuples(st.just("pop"), st.just(""), st.just(0)),
        st.tuples(st.just("remove"), st.just(""), st.integers(0, 50)),
    ),
    max_size=40,
)


@given(operations)
def test_fair_queue_ahead_predicts_the_pop_order(ops: list[tuple[str, str, int]]) -> None:
    queue: FairQueue[str] = FairQueue()
    queued: list[str] = []
    for n, (op, team, value) in enumerate(ops):
        if op == "push":
            queue.push(team, f"{team}{n}", weight=value)
            queued.append(f"{team}{n}")
        elif op == "pop" and (item := queue.pop()) is not None:
            queued.remove(item)
        elif op == "remove" and queued:
            assert queue.remove(queued.pop(value % len(queued)))
    predicted = {item: queue.ahead(item) for item in queued}
    assert len(queue) == len(queued)
    assert {item: position for position, item in enumerate(drain(queue))} == predicted
