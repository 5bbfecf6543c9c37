"""Where token buckets and stream slots live: the database, or Redis when configured.

Both stores keep the same integer arithmetic (:func:`~apps.usage.limiters.base.refilled`)
and the same contract: ``acquire`` draws ``tokens`` from every bucket and takes a slot
under every stream limit, all or nothing, or returns the first :class:`Refusal`;
``release`` gives back ``difference`` tokens and frees the slots. The database store
(:mod:`~apps.usage.limiters.database`) runs inside the caller's transaction (its rows are
locked and conditionally updated there); the Redis store
(:mod:`~apps.usage.limiters.redis`) is one Lua script per operation, and also counts the
period quotas.
"""

from __future__ import annotations

from django.conf import settings

from apps.usage.limiters.base import (
    CONCURRENCY_RETRY_SECONDS,
    TOKENS,
    USD,
    Bucket,
    Limiter,
    LimiterUnavailable,
    Quota,
    QuotaKey,
    QuotaUnseeded,
    Refusal,
    Slot,
    bucket_refusal,
    buckets_and_slots,
    refilled,
    slot_refusal,
)
from apps.usage.limiters.database import DatabaseLimiter
from apps.usage.limiters.redis import RedisLimiter, redis_limiter

__all__ = [
    "CONCURRENCY_RETRY_SECONDS",
    "TOKENS",
    "USD",
    "Bucket",
    "DatabaseLimiter",
    "Limiter",
    "LimiterUnavailable",
    "Quota",
    "QuotaKey",
    "QuotaUnseeded",
    "RedisLimiter",
    "Refusal",
    "Slot",
    "bucket_refusal",
    "buckets_and_slots",
    "limiter",
    "limiter_keys_delete",
    "refilled",
    "slot_refusal",
]


def limiter(store: str | None = None) -> Limiter:
    """The limiter of ``store`` ("database" or "redis"); by default Redis when configured."""
    store = store or ("redis" if settings.RATE_LIMIT_REDIS_URL else "database")
    if store == "redis":
        return redis_limiter(settings.RATE_LIMIT_REDIS_URL, settings.RATE_LIMIT_KEY_PREFIX)
    return DatabaseLimiter()


def limiter_keys_delete(*, limit_ids: list[int], team_id: int | None = None) -> int:
    """Drop the Redis state of these limits, and with ``team_id`` that team's own (its
    request buckets and replay slots): none is kept elsewhere (the database's goes with
    the rows). How many keys went."""
    if not settings.RATE_LIMIT_REDIS_URL or not (limit_ids or team_id):
        return 0
    store = redis_limiter(settings.RATE_LIMIT_REDIS_URL, settings.RATE_LIMIT_KEY_PREFIX)
    return store.forget(limit_ids, team_id=team_id)
