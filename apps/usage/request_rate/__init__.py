"""Requests per team: a token bucket of requests in front of every authenticated endpoint.

Tokens are what answers cost, but keyword search, listings, uploads and replays cost none,
and they still spend the shared web process's CPU: each authenticated request takes one
request from its team's bucket (``REQUEST_RATE_PER_SECOND`` sustained, ``REQUEST_BURST``
at once, or the team's own ``Limit``), and one from the bucket of the view's
``throttle_scope`` where the view names one (``DEFAULT_THROTTLE_RATES``: /tokenize). Over
either: 429 ``rate_limited`` with an exact ``Retry-After``.

The buckets are in Redis when ``RATE_LIMIT_REDIS_URL`` is set (shared by every web
process), else in the process (the embedded default, one process). Redis unreachable:
this process's buckets until it is back, whatever ``RATE_LIMIT_REDIS_FALLBACK`` says for
tokens (a request costs none; refusing them all would take the whole API down with Redis).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import cast

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, SynchronousOnlyOperation
from django.utils import timezone
from rest_framework.settings import api_settings

from apps.accounts.models import Team
from apps.core.aio import db_call
from apps.usage import metrics
from apps.usage.budgets import (
    RateLimited,
    limits_cache,
)
from apps.usage.limiters import LimiterUnavailable, Refusal
from apps.usage.models import Limit
from apps.usage.request_rate.base import RequestBucket, RequestLimiter
from apps.usage.request_rate.local import LocalRequestLimiter
from apps.usage.request_rate.redis import RedisRequestLimiter, redis_request_limiter

__all__ = [
    "RequestBucket",
    "local_buckets",
    "request_aadmit",
    "request_admit",
    "request_buckets",
]

logger = logging.getLogger(__name__)

# This process's buckets: the store without Redis, and the fallback when it is down.
local_buckets = LocalRequestLimiter()

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# The buckets' clock (tests set their own; Redis is given it rather than using its own).
clock: Callable[[], datetime] = timezone.now


def request_buckets(
    *, team: Team, limits: list[Limit], scope: str | None = None
) -> list[RequestBucket]:
    """The buckets a request of ``team`` draws on; ``limits``: the team's (its row, if any)."""
    row = next((limit for limit in limits if limit.api_key_id is None), None)
    per_second = settings.REQUEST_RATE_PER_SECOND
    burst = settings.REQUEST_BURST
    if row is not None and row.requests_per_second is not None:
        per_second = row.requests_per_second
    if row is not None and row.request_burst is not None:
        burst = row.request_burst
    buckets = []
    if per_second:
        buckets.append(RequestBucket(f"team:{team.pk}", int(burst), per_second * 60.0))
    # DRF's rates are strings ("600/minute"); its stubs type them as numbers.
    rates = cast("dict[str, str | None]", api_settings.DEFAULT_THROTTLE_RATES)
    rate = rates.get(scope) if scope else None
    if rate:
        count, per_minute = _parse_rate(scope or "", rate)
        buckets.append(RequestBucket(f"{scope}:{team.pk}", count, per_minute))
    return buckets


def request_admit(*, team: Team, scope: str | None = None, now: datetime | None = None) -> None:
    """Take one request from each of ``team``'s buckets, or raise 429 ``rate_limited``
    (Redis down: this process's buckets decide)."""
    limits = limits_cache.get(team=team, api_key=None)
    buckets = request_buckets(team=team, limits=limits, scope=scope)
    if not buckets:
        return
    now = now or clock()
    store = _store()
    try:
        refusal = store.take(buckets, now=now)
    except LimiterUnavailable as exc:
        refusal = _fallback(buckets, now, exc)
    _refuse(refusal)


async def request_aadmit(
    *, team: Team, scope: str | None = None, now: datetime | None = None
) -> None:
    """:func:`request_admit` on the event loop: Redis awaited, the limits read on the
    database pool only when this process has not cached them."""
    try:
        limits = limits_cache.get(team=team, api_key=None)
    except SynchronousOnlyOperation:  # not cached: it reads the database
        limits = await db_call(limits_cache.get)(team=team, api_key=None)
    buckets = request_buckets(team=team, limits=limits, scope=scope)
    if not buckets:
        return
    now = now or clock()
    store = _store()
    try:
        if isinstance(store, RedisRequestLimiter):
            refusal = await store.atake(buckets, now=now)
        else:
            refusal = store.take(buckets, now=now)
    except LimiterUnavailable as exc:
        refusal = _fallback(buckets, now, exc)
    _refuse(refusal)


def _store() -> RequestLimiter:
    if settings.RATE_LIMIT_REDIS_URL:
        return redis_request_limiter(settings.RATE_LIMIT_REDIS_URL, settings.RATE_LIMIT_KEY_PREFIX)
    return local_buckets


def _fallback(
    buckets: list[RequestBucket], now: datetime, exc: LimiterUnavailable
) -> Refusal | None:
    # Requests cost no tokens: with Redis down, each process limits its own rather than
    # refusing every request (``RATE_LIMIT_REDIS_FALLBACK`` governs tokens only).
    logger.warning("the request limiter is down, limiting in this process: %s", exc)
    return local_buckets.take(buckets, now=now)


def _refuse(refusal: Refusal | None) -> None:
    if refusal is None:
        return
    metrics.RATE_LIMITED.labels(refusal.code).inc()
    raise RateLimited(
        f"Too many requests for this team; retry in {refusal.retry_after} s.",
        code=refusal.code,
        headers=refusal.headers(),
    )


def _parse_rate(scope: str, rate: str) -> tuple[int, float]:
    """DRF's rate format ("600/minute"): the burst and the rate per minute."""
    count, _, period = rate.partition("/")
    if not count.isdigit() or int(count) < 1 or period[:1] not in _PERIODS:
        raise ImproperlyConfigured(
            f"DEFAULT_THROTTLE_RATES[{scope!r}] is not like 600/minute: {rate!r}"
        )
    return int(count), int(count) * 60 / _PERIODS[period[:1]]
