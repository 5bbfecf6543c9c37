"""Token buckets, stream slots and period quotas in Redis: one Lua script per operation,
so each is atomic on the server, with the caller's clock passed in (tests inject one) or
Redis's own.

Redis also counts the period quotas (:meth:`RedisLimiter.admit`: quotas, buckets and
slots in one script). A quota is a hash: ``base`` (what settled, as the database records
it), ``held`` (what open reservations hold), one ``h:<token>`` field per hold, and a
sorted set of the holds by expiry, so that a hold whose process died before writing its
reservation expires by itself. A missing hash is seeded from the database
(:meth:`RedisLimiter.quota_seed`), which stays the record: settling adds to ``base`` what
it adds to the database counter, and the periodic job resets ``base`` to the record.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime, timedelta
from typing import Any

import redis
from django.conf import settings

from apps.usage.limiters.base import (
    USD,
    Bucket,
    LimiterUnavailable,
    Quota,
    QuotaKey,
    QuotaUnseeded,
    Refusal,
    Slot,
    bucket_refusal,
    slot_refusal,
)

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

# Holds past their expiry leave a quota (their process died before settling or before
# writing its reservation); what is left is base + held.
_LUA_QUOTA = """
local function expire_holds(q, z, now)
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  if #gone == 0 then return end
  local drop = 0
  for _, m in ipairs(gone) do
    local v = redis.call('HGET', q, 'h:' .. m)
    if v then
      drop = drop + tonumber(v)
      redis.call('HDEL', q, 'h:' .. m)
    end
  end
  redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
  if drop > 0 then redis.call('HINCRBY', q, 'held', -drop) end
end
local function used(q)
  local state = redis.call('HMGET', q, 'base', 'held')
  return tonumber(state[1]) + (tonumber(state[2]) or 0)
end
"""

# KEYS: buckets, slots, then a (hash, holds) pair per quota. ARGV: now, tokens, #buckets,
# member, slot ttl ms, #slots, capacity and rate per bucket, maximum per slot, then
# maximum, key ttl ms, the hold's expiry (ms) and the amount held (tokens, or a money
# budget's nano-dollars) per quota. Quotas are checked first,
# then buckets, then slots; nothing is charged unless all fit. Returns {0} when admitted,
# {1, i, level} when bucket i is short, {2, j} when slot j is full, {3, k} when quota k
# is not seeded, {4, k, used} when quota k is short. Extending a hold is the same call
# with no slots: the member's hold grows.
_LUA_ADMIT = (
    _LUA_REFILL
    + _LUA_QUOTA
    + """
local now, tokens, nb = now_ms(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local member, ttl, ns = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local sa, qa, qk = 6 + 2 * nb, 6 + 2 * nb + ns, nb + ns
local nq = (#KEYS - qk) / 2
for k = 1, nq do
  local q, z = KEYS[qk + 2 * k - 1], KEYS[qk + 2 * k]
  if redis.call('HEXISTS', q, 'base') == 0 then return {3, k} end
  expire_holds(q, z, now)
  local u = used(q)
  if u + tonumber(ARGV[qa + 4 * k]) > tonumber(ARGV[qa + 4 * k - 3]) then return {4, k, u} end
end
local levels, ats = {}, {}
for i = 1, nb do
  local capacity, rate = tonumber(ARGV[5 + 2 * i]), tonumber(ARGV[6 + 2 * i])
  local level, at = refill(KEYS[i], capacity, rate, now)
  if level < tokens then return {1, i, level} end
  levels[i], ats[i] = level, at
end
for j = 1, ns do
  local key = KEYS[nb + j]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if redis.call('ZCARD', key) >= tonumber(ARGV[sa + j]) then return {2, j} end
end
for i = 1, nb do
  store(KEYS[i], levels[i] - tokens, ats[i], tonumber(ARGV[5 + 2 * i]), tonumber(ARGV[6 + 2 * i]))
end
for j = 1, ns do
  redis.call('ZADD', KEYS[nb + j], now + ttl, member)
  redis.call('PEXPIRE', KEYS[nb + j], ttl)
end
for k = 1, nq do
  local q, z, keep = KEYS[qk + 2 * k - 1], KEYS[qk + 2 * k], tonumber(ARGV[qa + 4 * k - 2])
  local amount = tonumber(ARGV[qa + 4 * k])
  redis.call('HINCRBY', q, 'held', amount)
  redis.call('HINCRBY', q, 'h:' .. member, amount)
  redis.call('ZADD', z, ARGV[qa + 4 * k - 1], member)
  redis.call('PEXPIRE', q, keep)
  redis.call('PEXPIRE', z, keep)
end
return {0}
"""
)

# KEYS: the once-only marker, buckets, slots, then a (hash, holds) pair per quota. ARGV:
# now, difference, #buckets, member, marker ttl ms, #slots, capacity and rate per bucket,
# then what was actually used per quota (tokens, or nano-dollars). The member's holds go;
# what it used joins each quota's base (a quota missing from Redis is seeded later from
# the database, which has it).
# Returns 0 if already released.
_LUA_RELEASE = (
    _LUA_REFILL
    + """
local now, difference, nb = now_ms(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local member, ns = ARGV[4], tonumber(ARGV[6])
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', tonumber(ARGV[5])) then return 0 end
for i = 1, nb do
  local capacity, rate = tonumber(ARGV[5 + 2 * i]), tonumber(ARGV[6 + 2 * i])
  local level, at = refill(KEYS[i + 1], capacity, rate, now)
  store(KEYS[i + 1], math.min(level + difference, capacity), at, capacity, rate)
end
for j = 1, ns do redis.call('ZREM', KEYS[nb + 1 + j], member) end
local qk = nb + ns + 1
for k = qk + 1, #KEYS, 2 do
  local q, z = KEYS[k], KEYS[k + 1]
  local actual = tonumber(ARGV[6 + 2 * nb + (k - qk + 1) / 2])
  if redis.call('HEXISTS', q, 'base') == 1 then
    local held = redis.call('HGET', q, 'h:' .. member)
    if held then
      redis.call('HDEL', q, 'h:' .. member)
      redis.call('HINCRBY', q, 'held', -tonumber(held))
    end
    redis.call('ZREM', z, member)
    redis.call('HINCRBY', q, 'base', actual)
  end
end
return 1
"""
)

# KEYS: a quota's hash and holds. ARGV: base, key ttl ms, then member, tokens and expiry
# (ms) per open hold. Only if the quota is not there yet; returns 1 if seeded.
_LUA_SEED = """
if redis.call('HEXISTS', KEYS[1], 'base') == 1 then return 0 end
local held = 0
for i = 3, #ARGV, 3 do
  redis.call('HSET', KEYS[1], 'h:' .. ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[2], ARGV[i + 2], ARGV[i])
  held = held + tonumber(ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'base', ARGV[1], 'held', held)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
return 1
"""

# KEYS: a quota's hash and holds. ARGV: now, base (the record). Expired holds go, base is
# the record; a quota not in Redis is left to be seeded. Returns base + held, or nil.
_LUA_RECONCILE = (
    _LUA_REFILL
    + _LUA_QUOTA
    + """
if redis.call('HEXISTS', KEYS[1], 'base') == 0 then return nil end
expire_holds(KEYS[1], KEYS[2], now_ms(ARGV[1]))
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'base', ARGV[2]) end
return used(KEYS[1])
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
        self._admit = self.client.register_script(_LUA_ADMIT)
        self._release = self.client.register_script(_LUA_RELEASE)
        self._available = self.client.register_script(_LUA_AVAILABLE)
        self._seed = self.client.register_script(_LUA_SEED)
        self._reconcile = self.client.register_script(_LUA_RECONCILE)

    def acquire(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        tokens: int,
        now: datetime,
    ) -> Refusal | None:
        return self.admit(
            token=token, buckets=buckets, slots=slots, quotas=[], tokens=tokens, now=now
        )

    def admit(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        quotas: list[Quota],
        tokens: int,
        now: datetime,
        expires_at: datetime | None = None,
        nanos: int = 0,
    ) -> Refusal | None:
        """Quotas, buckets and slots in one script, all or nothing: None when admitted,
        else the first refusal (a money budget is charged ``nanos``, the rest ``tokens``).
        Raises :class:`QuotaUnseeded`. The quota
        holds expire at ``expires_at`` (the reservation's expiry; by default, the slots'
        ttl from now). With no slots and a held ``token``, this extends its hold."""
        hold_expiry = _ms(expires_at or now + timedelta(milliseconds=_ttl_ms()))
        keys = [self._bucket_key(b) for b in buckets] + [self._slot_key(s) for s in slots]
        args: list[Any] = [_ms(now), tokens, len(buckets), str(token), _ttl_ms(), len(slots)]
        for bucket in buckets:
            args += [bucket.capacity, bucket.rate]
        args += [slot.maximum for slot in slots]
        for quota in quotas:
            keys += self._quota_keys(quota.key)
            amount = quota.amount(tokens=tokens, nanos=nanos)
            args += [quota.maximum, _keep_ms(quota, now), hold_expiry, amount]
        result: list[int] = self._call(self._admit, keys, args)
        if result[0] == 1:
            return bucket_refusal(buckets[result[1] - 1], int(result[2]), tokens)
        if result[0] == 2:
            return slot_refusal(slots[result[1] - 1])
        if result[0] == 3:
            raise QuotaUnseeded(quotas[result[1] - 1])
        if result[0] == 4:
            return quotas[result[1] - 1].refusal(int(result[2]), now)
        return None

    def release(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        difference: int,
        now: datetime,
        quotas: list[QuotaKey] | None = None,
        actual: int = 0,
        actual_nanos: int = 0,
    ) -> None:
        """Also: the token's quota holds go and what was used (``actual`` tokens, or
        ``actual_nanos`` for a money budget) joins each quota's base."""
        keys = [f"{self.prefix}released:{token}"]
        keys += [self._bucket_key(b) for b in buckets] + [self._slot_key(s) for s in slots]
        args: list[Any] = [_ms(now), difference, len(buckets), str(token), 2 * _ttl_ms()]
        args.append(len(slots))
        for bucket in buckets:
            args += [bucket.capacity, bucket.rate]
        for key in quotas or []:
            keys += self._quota_keys(key)
            args.append(actual_nanos if key.unit == USD else actual)
        self._call(self._release, keys, args)

    def available(self, bucket: Bucket, now: datetime) -> int:
        args = [_ms(now), bucket.capacity, bucket.rate]
        return int(self._call(self._available, [self._bucket_key(bucket)], args))

    def quota_seed(
        self,
        *,
        quota: Quota,
        used: int,
        holds: list[tuple[uuid.UUID, int, datetime]],
        now: datetime,
    ) -> None:
        """Put a quota missing from Redis there: ``used`` as the database records it and
        the open ``holds`` (token, tokens, expiry). A quota already there is left alone."""
        args: list[Any] = [used, _keep_ms(quota, now)]
        for token, tokens, expires_at in holds:
            args += [str(token), tokens, _ms(expires_at)]
        self._call(self._seed, self._quota_keys(quota.key), args)

    def quota_used(self, key: QuotaKey, now: datetime, *, record: int | None = None) -> int | None:
        """What a quota counts (settled plus held), expired holds dropped; None when it is
        not in Redis. ``record``: the database's figure, which replaces the settled part."""
        args = [_ms(now), "" if record is None else record]
        used = self._call(self._reconcile, self._quota_keys(key), args)
        return None if used is None else int(used)

    def _quota_keys(self, key: QuotaKey) -> list[str]:
        name = f"{self.prefix}quota:{key.name}"
        return [name, f"{name}:holds"]

    def _bucket_key(self, bucket: Bucket) -> str:
        return f"{self.prefix}bucket:{bucket.limit_id}"

    def _slot_key(self, slot: Slot) -> str:
        return f"{self.prefix}{slot.kind}:{slot.limit_id}"

    def forget(self, limit_ids: list[int], *, team_id: int | None = None) -> int:
        """Delete every key of these limits (bucket, stream slots, each period's quota and
        its holds), and of ``team_id`` (its request buckets, its replay slots): for rows
        being deleted. How many keys went."""
        deleted = 0
        try:
            for limit_id in limit_ids:
                names = [f"{self.prefix}bucket:{limit_id}", f"{self.prefix}streams:{limit_id}"]
                names += self.client.scan_iter(match=f"{self.prefix}quota:{limit_id}:*", count=500)
                deleted += int(self.client.delete(*names))
            if team_id is not None:
                names = [f"{self.prefix}replays:{team_id}"]
                names += self.client.scan_iter(match=f"{self.prefix}requests:*:{team_id}")
                deleted += int(self.client.delete(*names))
        except redis.RedisError as exc:
            raise LimiterUnavailable(f"Redis is unreachable: {exc}") from exc
        return deleted

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


def _keep_ms(quota: Quota, now: datetime) -> int:
    """A quota's keys outlive its period by a day (and its holds)."""
    left = (quota.resets_at - now).total_seconds() + 86_400
    return int(max(left * 1000, 2 * _ttl_ms()))


@functools.cache
def _redis_client(url: str) -> redis.Redis:
    timeout = settings.RATE_LIMIT_REDIS_TIMEOUT
    return redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)


@functools.cache
def redis_limiter(url: str, prefix: str) -> RedisLimiter:
    return RedisLimiter(url, prefix)
