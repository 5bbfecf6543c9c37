"""Failed API key lookups, counted per client address.

An unknown prefix costs a database query (the key cache keeps a miss only briefly), and a
made-up key is free to send: each address may fail ``API_KEY_FAILURE_BURST`` lookups at
once, then ``API_KEY_FAILURES_PER_MINUTE``; past that, anything but a key this process
has seen (with its secret) answers 429 ``rate_limited`` with ``Retry-After``, before any
query. The
buckets are in Redis when ``RATE_LIMIT_REDIS_URL`` is set (every process shares them),
else in process; while Redis is unreachable, in process.
"""

from __future__ import annotations

import functools
import logging

from django.conf import settings
from redis import Redis, RedisError

from apps.accounts.probes.base import ProbeBuckets, ProbeLimit
from apps.accounts.probes.local import LocalProbeBuckets
from apps.accounts.probes.redis import RedisProbeBuckets

__all__ = ["ProbeBuckets", "ProbeLimit", "key_probe_wait", "local_probe_buckets"]

log = logging.getLogger(__name__)


def key_probe_wait(*, address: str, failed: bool) -> float:
    """Seconds ``address`` must wait before its next key lookup (0: it may go on). With
    ``failed``, first spend one of its failures: a lookup that just failed."""
    limit = ProbeLimit(settings.API_KEY_FAILURE_BURST, settings.API_KEY_FAILURES_PER_MINUTE)
    if limit.burst <= 0 or limit.per_minute <= 0:
        return 0.0
    cost = 1 if failed else 0
    url = settings.RATE_LIMIT_REDIS_URL
    if url:
        try:
            return _redis_buckets(url, settings.RATE_LIMIT_KEY_PREFIX).take(
                address=address, limit=limit, cost=cost
            )
        except RedisError as exc:
            log.warning("key probe buckets in process: Redis is unreachable (%s)", exc)
    return local_probe_buckets().take(address=address, limit=limit, cost=cost)


@functools.cache
def local_probe_buckets() -> LocalProbeBuckets:
    """This process's buckets (the embedded default, and the fallback without Redis)."""
    return LocalProbeBuckets()


@functools.cache
def _redis_buckets(url: str, prefix: str) -> RedisProbeBuckets:
    timeout = settings.RATE_LIMIT_REDIS_TIMEOUT
    client = Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    return RedisProbeBuckets(client, prefix=prefix)
