"""A fair, capacity-bounded queue in front of an inference upstream.

llama.cpp's server runs one request at a time and vLLM runs ``max_num_seqs``; anything
sent beyond that waits inside the server, invisible, unfair and uncancellable. So the app
holds the line itself: at most ``capacity`` requests are in flight to an upstream, and the
rest wait here, served by deficit round robin over teams (each team gets ``weight``
requests per round, FIFO within a team), so one team's burst cannot starve another.

Two implementations share one contract:

- :class:`LocalScheduler` keeps the queue in the process (asyncio), for the embedded
  default of a single web process.
- :class:`RedisScheduler` keeps it in Redis, shared by every web process: slots are leases
  that expire unless renewed, so a crashed process gives its slots back by itself.

A request granted at once costs nothing extra: no task switch locally, one Lua call in
Redis. A waiter that gives up (timeout) gets :class:`~inference.errors.QueueFull` with a
``retry_after`` estimated from the measured service time; a waiter that is cancelled
(client gone) leaves the queue at once and never holds a slot.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import redis.asyncio
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from inference.errors import QueueFull, SchedulerUnavailable

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=Hashable)
R = TypeVar("R")

# Before the first lease is released there is no measured service time. Five seconds is
# a guess at one streamed answer of a few hundred tokens on either tier; it only sets the
# first Retry-After, and the first measurement replaces it.
DEFAULT_SERVICE_SECONDS = 5.0
# Weight of the newest hold duration in the moving average: about the last ten requests
# count, so the estimate follows a change of model or load within seconds, not minutes.
SERVICE_EWMA_ALPHA = 0.2
# The first pause before resubscribing to wake-ups after a failure; it doubles with each
# failure in a row, up to ``poll_seconds`` (the waiters poll meanwhile anyway).
LISTEN_RETRY_SECONDS = 0.025


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


def _retry_after(*, mean_service: float | None, position: int, capacity: int) -> float:
    """Seconds until the slot this waiter would have had is likely free: the ``position``
    requests ahead of it, and its own, drain ``capacity`` at a time."""
    mean = DEFAULT_SERVICE_SECONDS if mean_service is None else mean_service
    return float(max(1, math.ceil(mean * (position + 1) / capacity)))


def _check(*, weight: int, timeout: float) -> None:
    if not isinstance(weight, int) or weight < 1:
        raise ValueError(f"weight must be a positive integer, not {weight!r}")
    if timeout < 0:
        raise ValueError(f"timeout must not be negative, not {timeout!r}")


def _raise_if_cancelling() -> None:
    """Deliver a cancellation that was requested but swallowed on the way.

    redis-py sends each command under ``asyncio.wait_for``, which on Python 3.11 drops a
    cancellation that lands just as the send completes (bpo-42130, fixed in 3.12). A
    waiter that missed its client's disconnect would sit in the queue, and could take a
    slot, for nobody; the task's own count of pending cancellations still says so.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _check_capacity(capacity: int) -> None:
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, not {capacity!r}")


# --------------------------------------------------------------------------------------
# In process


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
        _check_capacity(capacity)
        self.capacity = capacity
        self._clock = clock
        self._held = 0
        self._queue: FairQueue[_Waiter] = FairQueue()
        self._service = _Ewma()

    async def acquire(self, *, team: str, weight: int = 1, timeout: float) -> Lease:  # noqa: ASYNC109
        _check(weight=weight, timeout=timeout)
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
                    retry_after=_retry_after(
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


# --------------------------------------------------------------------------------------
# Across processes, in Redis
#
# Keys, under ``{key_prefix}{{name}}:`` (the braces are a cluster hash tag, so every key of
# one queue lives on one shard):
#   ring          list of teams with waiters; the head is the RIGHT end, newcomers LPUSH
#   deficit       hash team -> requests left in the head team's current turn
#   weight        hash team -> quantum (requests per turn)
#   team:<team>   list of that team's tickets, FIFO
#   waiting       hash ticket -> team, for every queued ticket
#   alive         zset ticket -> when a queued ticket lapses unless its waiter polls again
#   leases        zset ticket -> lease expiry; its size is the number of slots held
#   granted       hash ticket -> grant time, for the service-time average
#   stats         hash: mean (EWMA of hold durations, seconds)
#
# A ticket is ``<instance>:<random>``, ``<instance>`` naming the RedisScheduler (one per
# process and event loop) whose waiter holds it. When dispatch grants a ticket it
# PUBLISHes the ticket on ``wake:<instance>`` (a pub/sub channel, not a key), which that
# instance's one subscription hears; the lease in ``leases`` is the grant itself, so a
# waiter that missed the message finds it by polling. No connection is held per waiter.
#
# Every script runs ``purge`` then ``dispatch`` (except renew and cancel), so expired
# leases and abandoned tickets are reclaimed whenever anyone touches the queue.

_LUA_PRELUDE = """
local RING, DEFICIT, WEIGHT, WAITING, ALIVE, LEASES, GRANTED, STATS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local capacity, lease_seconds, base = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]

local function team_key(team) return base .. 'team:' .. team end

local function retire(team)
  redis.call('LREM', RING, 1, team)
  redis.call('HDEL', DEFICIT, team)
  redis.call('HDEL', WEIGHT, team)
end

local function unqueue(ticket, team)
  local queue = team_key(team)
  redis.call('LREM', queue, 1, ticket)
  redis.call('HDEL', WAITING, ticket)
  redis.call('ZREM', ALIVE, ticket)
  if redis.call('LLEN', queue) == 0 then retire(team) end
end

local function purge()
  for _, ticket in ipairs(redis.call('ZRANGEBYSCORE', LEASES, '-inf', now)) do
    redis.call('ZREM', LEASES, ticket)
    redis.call('HDEL', GRANTED, ticket)
  end
  for _, ticket in ipairs(redis.call('ZRANGEBYSCORE', ALIVE, '-inf', now)) do
    local team = redis.call('HGET', WAITING, ticket)
    if team then unqueue(ticket, team) else redis.call('ZREM', ALIVE, ticket) end
  end
end

-- FairQueue.pop: the head team serves, topping up its deficit at the start of its turn.
local function next_ticket()
  while true do
    local team = redis.call('LINDEX', RING, -1)
    if not team then return nil end
    local queue = team_key(team)
    local ticket = redis.call('LPOP', queue)
    if ticket then
      local deficit = tonumber(redis.call('HGET', DEFICIT, team)) or 0
      if deficit <= 0 then
        deficit = deficit + (tonumber(redis.call('HGET', WEIGHT, team)) or 1)
      end
      deficit = deficit - 1
      if redis.call('LLEN', queue) == 0 then
        retire(team)
      elseif deficit <= 0 then
        redis.call('HSET', DEFICIT, team, 0)
        redis.call('RPOPLPUSH', RING, RING)
      else
        redis.call('HSET', DEFICIT, team, deficit)
      end
      redis.call('HDEL', WAITING, ticket)
      redis.call('ZREM', ALIVE, ticket)
      return ticket
    end
    retire(team)  -- a ring entry without tickets cannot happen; never stall on one
  end
end

local function grant(ticket)
  redis.call('ZADD', LEASES, now + lease_seconds, ticket)
  redis.call('HSET', GRANTED, ticket, now)
end

local function dispatch()
  purge()
  while redis.call('ZCARD', LEASES) < capacity do
    local ticket = next_ticket()
    if not ticket then return end
    grant(ticket)
    -- Wake the waiter through its scheduler's channel; nobody listening loses nothing.
    local instance = string.match(ticket, '^(%x+):')
    if instance then redis.call('PUBLISH', base .. 'wake:' .. instance, ticket) end
  end
end

-- FairQueue.ahead: replay the rounds on counters until the ticket at ``index`` of
-- ``team``'s queue would be served.
local function ahead(team, index)
  local ring = redis.call('LRANGE', RING, 0, -1)
  local order, first, last = {}, 1, 0
  local length, deficit, weight = {}, {}, {}
  for i = #ring, 1, -1 do
    local t = ring[i]
    last = last + 1
    order[last] = t
    length[t] = redis.call('LLEN', team_key(t))
    deficit[t] = tonumber(redis.call('HGET', DEFICIT, t)) or 0
    weight[t] = tonumber(redis.call('HGET', WEIGHT, t)) or 1
  end
  local served = 0
  while first <= last do
    local head = order[first]
    if deficit[head] <= 0 then deficit[head] = deficit[head] + weight[head] end
    if head == team and index == 0 then return served end
    served = served + 1
    length[head] = length[head] - 1
    deficit[head] = deficit[head] - 1
    if head == team then index = index - 1 end
    if length[head] == 0 then
      first = first + 1
    elseif deficit[head] <= 0 then
      first = first + 1
      last = last + 1
      order[last] = head
    end
  end
  return served
end
"""

# ARGV[5..7]: ticket, team, weight. Returns 1 when granted at once, else 0 (queued).
_LUA_ENQUEUE = (
    _LUA_PRELUDE
    + """
local ticket, team, weight = ARGV[5], ARGV[6], tonumber(ARGV[7])
purge()
if redis.call('HLEN', WAITING) == 0 and redis.call('ZCARD', LEASES) < capacity then
  grant(ticket)
  return 1
end
if redis.call('RPUSH', team_key(team), ticket) == 1 then redis.call('LPUSH', RING, team) end
redis.call('HSET', WEIGHT, team, weight)
redis.call('HSET', WAITING, ticket, team)
redis.call('ZADD', ALIVE, now + lease_seconds, ticket)
dispatch()
if redis.call('ZSCORE', LEASES, ticket) then return 1 end
return 0
"""
)

# ARGV[5]: the polling waiter's ticket, kept alive. Reclaims expired leases. Returns 1
# when the ticket holds a lease (granted, whether or not its wake-up was heard), else 0.
_LUA_POLL = (
    _LUA_PRELUDE
    + """
if redis.call('HEXISTS', WAITING, ARGV[5]) == 1 then
  redis.call('ZADD', ALIVE, 'XX', now + lease_seconds, ARGV[5])
end
dispatch()
if redis.call('ZSCORE', LEASES, ARGV[5]) then return 1 end
return 0
"""
)

# ARGV[5..6]: ticket, EWMA alpha. Returns 1 if the lease was still held, else 0.
_LUA_RELEASE = (
    _LUA_PRELUDE
    + """
local ticket, alpha = ARGV[5], tonumber(ARGV[6])
local released = 0
if redis.call('ZREM', LEASES, ticket) == 1 then
  released = 1
  local since = tonumber(redis.call('HGET', GRANTED, ticket))
  if since then
    local sample = math.max(0, now - since)
    local mean = tonumber(redis.call('HGET', STATS, 'mean'))
    if mean then mean = mean + alpha * (sample - mean) else mean = sample end
    redis.call('HSET', STATS, 'mean', mean)
  end
end
redis.call('HDEL', GRANTED, ticket)
dispatch()
return released
"""
)

# ARGV[5]: ticket. Returns {0, position, mean} when it was taken out of the queue,
# {1} when it had been granted (the caller keeps or releases the lease), {2} when gone.
_LUA_CANCEL = (
    _LUA_PRELUDE
    + """
local ticket = ARGV[5]
local team = redis.call('HGET', WAITING, ticket)
if team then
  local index = redis.call('LPOS', team_key(team), ticket)
  local position = 0
  if index then position = ahead(team, index) end
  unqueue(ticket, team)
  return {0, position, redis.call('HGET', STATS, 'mean')}
end
if redis.call('ZSCORE', LEASES, ticket) then return {1} end
return {2}
"""
)

# ARGV[5]: ticket. Returns 1 if renewed, 0 if the lease had lapsed (its slot is gone).
_LUA_RENEW = (
    _LUA_PRELUDE
    + """
local expiry = tonumber(redis.call('ZSCORE', LEASES, ARGV[5]))
if expiry and expiry > now then
  redis.call('ZADD', LEASES, 'XX', now + lease_seconds, ARGV[5])
  return 1
end
return 0
"""
)

# Returns {waiting, held}, not counting what has lapsed but is not yet purged.
_LUA_COUNT = (
    _LUA_PRELUDE
    + """
local after = string.format('(%.17g', now)
return {redis.call('ZCOUNT', ALIVE, after, '+inf'), redis.call('ZCOUNT', LEASES, after, '+inf')}
"""
)

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
        _check_capacity(capacity)
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
        self._enqueue = redis.register_script(_LUA_ENQUEUE)
        self._poll = redis.register_script(_LUA_POLL)
        self._release = redis.register_script(_LUA_RELEASE)
        self._cancel = redis.register_script(_LUA_CANCEL)
        self._renew = redis.register_script(_LUA_RENEW)
        self._count = redis.register_script(_LUA_COUNT)
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
        _check(weight=weight, timeout=timeout)
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
                    retry_after=_retry_after(
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
            _raise_if_cancelling()
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
                _raise_if_cancelling()  # aclose() must stop it, whatever redis-py swallows
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
