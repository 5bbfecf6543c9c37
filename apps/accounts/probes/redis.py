"""Failed-key buckets in Redis, shared by every web process: one Lua script per failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from django.utils.asyncio import async_unsafe

from apps.accounts.probes.base import ProbeBuckets, ProbeLimit

# KEYS[1]: the address's bucket. ARGV: burst, failures per minute, cost, now in epoch
# ms (empty: Redis's clock). Returns the wait in ms as a string ("0": spent), since Lua
# numbers returned to Redis are truncated to integers.
TAKE = """
local burst = tonumber(ARGV[1])
local per_minute = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local since = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - since) * per_minute / 60000)
if tokens < 1 then
  return tostring((1 - tokens) * 60000 / per_minute)
end
if cost > 0 then
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens - cost), 'ts', tostring(now))
  redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 60000 / per_minute) + 1000)
end
return '0'
"""


class RedisProbeBuckets(ProbeBuckets):
    """``clock`` (epoch seconds) is for tests; by default the script reads Redis's own, so
    that web processes on several hosts share one."""

    def __init__(
        self, client: redis.Redis, *, prefix: str, clock: Callable[[], float] | None = None
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.clock = clock
        self._take: Any = client.register_script(TAKE)

    # Network I/O: refused on an event loop, so that an async view authenticates on the
    # database pool instead (``AsyncApiView`` retries there on SynchronousOnlyOperation).
    @async_unsafe
    def take(self, *, address: str, limit: ProbeLimit, cost: int) -> float:
        now = "" if self.clock is None else f"{self.clock() * 1000:.3f}"
        args = [limit.burst, repr(float(limit.per_minute)), cost, now]
        waited = self._take(keys=[f"{self.prefix}keyprobes:{address}"], args=args)
        return float(waited) / 1000
