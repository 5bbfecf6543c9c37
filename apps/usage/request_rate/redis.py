"""Request buckets in Redis, shared by every web process: one Lua script per request.

The script is the token buckets' refill (:data:`apps.usage.limiters.redis._LUA_REFILL`, the same
integer arithmetic and key expiry) taking one request from each bucket, all or nothing.
The async answer views await it on the event loop (:meth:`RedisRequestLimiter.atake`);
the other views call it from their thread.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
import redis.asyncio
from django.conf import settings

from apps.core.aio import loop_cached
from apps.usage.limiters import LimiterUnavailable, Refusal
from apps.usage.limiters.redis import _LUA_REFILL, _ms, _redis_client
from apps.usage.request_rate.base import RequestBucket, request_refusal

# KEYS: the buckets. ARGV: now (ms; empty: Redis's clock), then capacity and rate per
# bucket. Returns {0} when a request was taken from each, else {i, level, refilled at,
# now} for the first bucket i that holds none (times as strings: Redis truncates numbers).
_LUA_TAKE = (
    _LUA_REFILL
    + """
local now = now_ms(ARGV[1])
local levels, ats = {}, {}
for i = 1, #KEYS do
  local capacity, rate = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local level, at = refill(KEYS[i], capacity, rate, now)
  if level < 1 then
    return {i, level, string.format('%.3f', at), string.format('%.3f', now)}
  end
  levels[i], ats[i] = level, at
end
for i = 1, #KEYS do
  store(KEYS[i], levels[i] - 1, ats[i], tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1]))
end
return {0}
"""
)

REDIS_POOL_SIZE = 64


class RedisRequestLimiter:
    store = "redis"

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self._take = _redis_client(url).register_script(_LUA_TAKE)

    def take(self, buckets: list[RequestBucket], *, now: datetime) -> Refusal | None:
        keys, args = self._call_args(buckets, now)
        try:
            result = self._take(keys=keys, args=args)
        except redis.RedisError as exc:
            raise LimiterUnavailable(f"Redis is unreachable: {exc}") from exc
        return self._refusal(buckets, result)

    async def atake(self, buckets: list[RequestBucket], *, now: datetime) -> Refusal | None:
        """:meth:`take` on the event loop, through this loop's async client."""
        keys, args = self._call_args(buckets, now)
        try:
            result = await _async_script(self.url)(keys=keys, args=args)
        except redis.RedisError as exc:
            raise LimiterUnavailable(f"Redis is unreachable: {exc}") from exc
        return self._refusal(buckets, result)

    def _call_args(
        self, buckets: list[RequestBucket], now: datetime
    ) -> tuple[list[str], list[Any]]:
        keys = [f"{self.prefix}requests:{bucket.name}" for bucket in buckets]
        args: list[Any] = [_ms(now)]
        for bucket in buckets:
            args += [bucket.capacity, repr(bucket.rate)]
        return keys, args

    @staticmethod
    def _refusal(buckets: list[RequestBucket], result: Any) -> Refusal | None:
        if int(result[0]) == 0:
            return None
        bucket = buckets[int(result[0]) - 1]
        now = _from_ms(result[3])
        refilled_at = _from_ms(result[2])
        return request_refusal(bucket, level=int(result[1]), refilled_at=refilled_at, now=now)


_EPOCH = datetime.fromtimestamp(0, tz=UTC)


def _from_ms(value: bytes | str) -> datetime:
    text = value.decode() if isinstance(value, bytes) else value
    return _EPOCH + timedelta(milliseconds=float(text))


@loop_cached
def _async_script(url: str) -> Any:
    """This loop's client (bounded pool; the limiter's short timeouts) and the script."""
    timeout = settings.RATE_LIMIT_REDIS_TIMEOUT
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url,
        max_connections=REDIS_POOL_SIZE,
        timeout=timeout,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
    )
    return redis.asyncio.Redis(connection_pool=pool).register_script(_LUA_TAKE)


@functools.cache
def redis_request_limiter(url: str, prefix: str) -> RedisRequestLimiter:
    return RedisRequestLimiter(url, prefix)
