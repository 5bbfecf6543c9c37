"""Where token buckets and stream slots live: the database, or Redis when configured.

Both stores keep the same integer arithmetic (whole tokens earned since the last refill,
the refill clock moving only by what those tokens took) and the same contract: ``acquire``
draws ``tokens`` from every bucket and takes a slot under every stream limit, all or
nothing, or returns the first :class:`Refusal`; ``release`` gives back ``difference``
tokens and frees the slots. The database store runs inside the caller's transaction (its
rows are locked and conditionally updated there); the Redis store is one Lua script per
operation, so each is atomic on the server, with the caller's clock passed in (tests
inject one) or Redis's own.
"""

from __future__ import annotations

import functools
import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import redis
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Greatest, Least

from apps.usage.models import Limit, StreamCounter, TokenBucket

CONCURRENCY_RETRY_SECONDS = 1


@dataclass(frozen=True)
class Bucket:
    limit_id: int
    capacity: int
    rate: int  # tokens per minute
    scope: str  # "team" or "key"


@dataclass(frozen=True)
class Slot:
    limit_id: int
    maximum: int
    scope: str


@dataclass(frozen=True)
class Refusal:
    code: str
    limit: int
    remaining: int
    retry_after: int
    unit: str = "tokens"


class LimiterUnavailable(Exception):
    """The store that enforces a limit cannot be reached."""


class Limiter(Protocol):
    store: str

    def acquire(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        tokens: int,
        now: datetime,
    ) -> Refusal | None: ...

    def release(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        difference: int,
        now: datetime,
    ) -> None: ...

    def available(self, bucket: Bucket, now: datetime) -> int: ...


def bucket_refusal(bucket: Bucket, level: int, tokens: int) -> Refusal:
    """When the bucket will hold ``tokens`` again: exact, from its refill rate."""
    retry = math.ceil((tokens - level) * 60 / bucket.rate) if bucket.rate else 86_400
    return Refusal(f"{bucket.scope}_tokens_per_minute", bucket.capacity, max(level, 0), retry)


def slot_refusal(slot: Slot) -> Refusal:
    # A stream ends when it ends: there is no exact time, so ask again soon.
    return Refusal(
        "too_many_concurrent_streams", slot.maximum, 0, CONCURRENCY_RETRY_SECONDS, "streams"
    )


def refilled(
    level: int, refilled_at: datetime, capacity: int, rate: int, now: datetime
) -> tuple[int, datetime]:
    """Whole tokens earned since the last refill; the clock moves by what they took, so
    fractions of a token are never lost or invented."""
    elapsed = max(0.0, (now - refilled_at).total_seconds())
    earned = int(elapsed * rate // 60) if rate else 0
    if level + earned >= capacity:
        return capacity, now
    return level + earned, refilled_at + timedelta(seconds=earned * 60 / rate)


class DatabaseLimiter:
    """Buckets and stream counters as rows, locked or conditionally updated in the
    caller's transaction (SQLite's IMMEDIATE transactions serialise writers)."""

    store = "database"

    def acquire(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        tokens: int,
        now: datetime,
    ) -> Refusal | None:
        for bucket in buckets:
            row = _locked_bucket(bucket, now)
            level, refilled_at = refilled(
                row.level, row.refilled_at, bucket.capacity, bucket.rate, now
            )
            if level < tokens:
                return bucket_refusal(bucket, level, tokens)
            TokenBucket.objects.filter(pk=row.pk).update(
                level=level - tokens, refilled_at=refilled_at
            )
        for slot in slots:
            counter = _get_or_create(StreamCounter, limit_id=slot.limit_id)
            moved = StreamCounter.objects.filter(pk=counter.pk, open__lt=slot.maximum).update(
                open=F("open") + 1
            )
            if not moved:
                return slot_refusal(slot)
        return None

    def release(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        difference: int,
        now: datetime,
    ) -> None:
        for bucket in buckets:
            TokenBucket.objects.filter(limit_id=bucket.limit_id).update(
                level=Least(F("level") + difference, bucket.capacity)
            )
        StreamCounter.objects.filter(limit_id__in=[slot.limit_id for slot in slots]).update(
            open=Greatest(F("open") - 1, 0)
        )

    def available(self, bucket: Bucket, now: datetime) -> int:
        row = TokenBucket.objects.filter(limit_id=bucket.limit_id).first()
        if row is None:
            return bucket.capacity
        return refilled(row.level, row.refilled_at, bucket.capacity, bucket.rate, now)[0]


def _locked_bucket(bucket: Bucket, now: datetime) -> TokenBucket:
    _get_or_create(
        TokenBucket,
        limit_id=bucket.limit_id,
        defaults={"level": bucket.capacity, "refilled_at": now},
    )
    return TokenBucket.objects.select_for_update().get(limit_id=bucket.limit_id)


def _get_or_create(model: Any, *, defaults: dict[str, Any] | None = None, **lookup: Any) -> Any:
    try:
        with transaction.atomic():
            return model.objects.get_or_create(defaults=defaults, **lookup)[0]
    except IntegrityError:  # created concurrently
        return model.objects.get(**lookup)


# One refill formula for all three scripts: the same integer arithmetic as ``refilled``.
# A missing bucket key is a full bucket (keys expire once they would have refilled).
_LUA_REFILL = """
local function now_ms(arg)
  local given = tonumber(arg)
  if given then return given end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function refill(key, capacity, rate, now)
  local state = redis.call('HMGET', key, 'level', 'at')
  local level, at = tonumber(state[1]), tonumber(state[2])
  if not level then return capacity, now end
  local earned = 0
  if rate > 0 then earned = math.floor(math.max(0, now - at) * rate / 60000) end
  if level + earned >= capacity then return capacity, now end
  return level + earned, at + earned * 60000 / rate
end
local function store(key, level, at, capacity, rate)
  redis.call('HSET', key, 'level', level, 'at', string.format('%.3f', at))
  if rate > 0 and level < capacity then
    redis.call('PEXPIRE', key, math.ceil((capacity - level) * 60000 / rate) + 60000)
  elseif level >= capacity then
    redis.call('DEL', key)
  end
end
"""

# KEYS: buckets, then slots. ARGV: now, tokens, #buckets, member, slot ttl ms,
# then capacity and rate per bucket, then the maximum per slot.
# Returns {0} when admitted, {1, i, level} when bucket i is short, {2, j} when slot j is full.
_LUA_ACQUIRE = (
    _LUA_REFILL
    + """
local now, tokens, nb = now_ms(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local member, ttl = ARGV[4], tonumber(ARGV[5])
local levels, ats = {}, {}
for i = 1, nb do
  local capacity, rate = tonumber(ARGV[4 + 2 * i]), tonumber(ARGV[5 + 2 * i])
  local level, at = refill(KEYS[i], capacity, rate, now)
  if level < tokens then return {1, i, level} end
  levels[i], ats[i] = level, at
end
for j = nb + 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[j], '-inf', now)
  if redis.call('ZCARD', KEYS[j]) >= tonumber(ARGV[5 + 2 * nb + j - nb]) then return {2, j - nb} end
end
for i = 1, nb do
  store(KEYS[i], levels[i] - tokens, ats[i], tonumber(ARGV[4 + 2 * i]), tonumber(ARGV[5 + 2 * i]))
end
for j = nb + 1, #KEYS do
  redis.call('ZADD', KEYS[j], now + ttl, member)
  redis.call('PEXPIRE', KEYS[j], ttl)
end
return {0}
"""
)

# KEYS: the once-only marker, buckets, then slots. ARGV: now, difference, #buckets, member,
# marker ttl ms, then capacity and rate per bucket. Returns 0 if already released.
_LUA_RELEASE = (
    _LUA_REFILL
    + """
local now, difference, nb = now_ms(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', tonumber(ARGV[5])) then return 0 end
for i = 1, nb do
  local capacity, rate = tonumber(ARGV[4 + 2 * i]), tonumber(ARGV[5 + 2 * i])
  local level, at = refill(KEYS[i + 1], capacity, rate, now)
  store(KEYS[i + 1], math.min(level + difference, capacity), at, capacity, rate)
end
for j = nb + 2, #KEYS do redis.call('ZREM', KEYS[j], ARGV[4]) end
return 1
"""
)

_LUA_AVAILABLE = (
    _LUA_REFILL
    + """
local level = refill(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), now_ms(ARGV[1]))
return level
"""
)


class RedisLimiter:
    """Buckets as hashes, stream slots as sorted sets of reservation tokens scored by
    their expiry (so a crashed holder's slot frees itself)."""

    store = "redis"

    def __init__(self, url: str, prefix: str) -> None:
        self.client = _redis_client(url)
        self.prefix = prefix
        self._acquire = self.client.register_script(_LUA_ACQUIRE)
        self._release = self.client.register_script(_LUA_RELEASE)
        self._available = self.client.register_script(_LUA_AVAILABLE)

    def acquire(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        tokens: int,
        now: datetime,
    ) -> Refusal | None:
        keys = [self._bucket_key(b) for b in buckets] + [self._slot_key(s) for s in slots]
        args: list[Any] = [_ms(now), tokens, len(buckets), str(token), _ttl_ms()]
        for bucket in buckets:
            args += [bucket.capacity, bucket.rate]
        args += [slot.maximum for slot in slots]
        result = self._call(self._acquire, keys, args)
        if result[0] == 1:
            return bucket_refusal(buckets[result[1] - 1], int(result[2]), tokens)
        if result[0] == 2:
            return slot_refusal(slots[result[1] - 1])
        return None

    def release(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        difference: int,
        now: datetime,
    ) -> None:
        keys = [f"{self.prefix}released:{token}"]
        keys += [self._bucket_key(b) for b in buckets] + [self._slot_key(s) for s in slots]
        args: list[Any] = [_ms(now), difference, len(buckets), str(token), 2 * _ttl_ms()]
        for bucket in buckets:
            args += [bucket.capacity, bucket.rate]
        self._call(self._release, keys, args)

    def available(self, bucket: Bucket, now: datetime) -> int:
        args = [_ms(now), bucket.capacity, bucket.rate]
        return int(self._call(self._available, [self._bucket_key(bucket)], args))

    def _bucket_key(self, bucket: Bucket) -> str:
        return f"{self.prefix}bucket:{bucket.limit_id}"

    def _slot_key(self, slot: Slot) -> str:
        return f"{self.prefix}streams:{slot.limit_id}"

    @staticmethod
    def _call(script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return script(keys=keys, args=args)
        except redis.RedisError as exc:
            raise LimiterUnavailable(f"Redis is unreachable: {exc}") from exc


def _ms(now: datetime | None) -> str:
    """The caller's clock in epoch milliseconds; empty means Redis's own clock."""
    return "" if now is None else f"{now.timestamp() * 1000:.3f}"


def _ttl_ms() -> int:
    return int(settings.RESERVATION_TTL_SECONDS * 1000)


@functools.cache
def _redis_client(url: str) -> redis.Redis:
    timeout = settings.RATE_LIMIT_REDIS_TIMEOUT
    return redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)


def limiter(store: str | None = None) -> Limiter:
    """The limiter of ``store`` ("database" or "redis"); by default Redis when configured."""
    store = store or ("redis" if settings.RATE_LIMIT_REDIS_URL else "database")
    if store == "redis":
        return _redis_limiter(settings.RATE_LIMIT_REDIS_URL, settings.RATE_LIMIT_KEY_PREFIX)
    return DatabaseLimiter()


@functools.cache
def _redis_limiter(url: str, prefix: str) -> RedisLimiter:
    return RedisLimiter(url, prefix)


def buckets_and_slots(limit: Limit) -> tuple[Bucket | None, Slot | None]:
    scope = "key" if limit.api_key_id else "team"
    bucket = slot = None
    if limit.burst_tokens is not None and limit.tokens_per_minute is not None:
        bucket = Bucket(limit.pk, int(limit.burst_tokens), int(limit.tokens_per_minute), scope)
    if limit.max_concurrent_streams is not None:
        slot = Slot(limit.pk, int(limit.max_concurrent_streams), scope)
    return bucket, slot
