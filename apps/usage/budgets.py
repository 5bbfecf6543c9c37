"""Token budgets: reserve before calling the model, settle on actual usage.

Reserve is one atomic, all-or-nothing step over every limit that applies (the team's and
the key's): each token bucket row is locked (``select_for_update``; SQLite's IMMEDIATE
transactions serialise writers) and each period quota moves by a conditional
``UPDATE … SET used = used + n WHERE used + n <= limit``. Nothing is read and then
written unlocked, so concurrent requests can never overspend. A refusal rolls every
step back and says when to retry. Settling replaces the reservation with what was really
used and refunds the difference; reservations a crashed process never settled expire and
are released by a periodic job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from apps.accounts.models import ApiKey, Team
from apps.core.exceptions import ApplicationError, InvalidRequest
from apps.usage.models import Limit, QuotaCounter, Reservation, TokenBucket


class RateLimited(ApplicationError):
    status, type, code = 429, "rate_limit_error", "team_tokens_per_minute"


@dataclass(frozen=True)
class Refusal:
    code: str
    limit: int
    remaining: int
    retry_after: int


def budget_reserve(
    *, team: Team, api_key: ApiKey | None, tokens: int, now: datetime | None = None
) -> Reservation:
    """Hold ``tokens`` against every limit of ``team`` and ``api_key``, or raise 429."""
    now = now or timezone.now()
    limits = list(
        Limit.objects.filter(Q(team=team, api_key__isnull=True) | Q(api_key=api_key))
        if api_key is not None
        else Limit.objects.filter(team=team, api_key__isnull=True)
    )
    with transaction.atomic():
        buckets: list[int] = []
        counters: list[int] = []
        for limit in limits:
            scope = "key" if limit.api_key_id else "team"
            if limit.burst_tokens is not None and limit.tokens_per_minute is not None:
                buckets.append(_draw(limit, tokens, now, scope))
            for period, quota in (("day", limit.daily_tokens), ("month", limit.monthly_tokens)):
                if quota is not None:
                    counters.append(_charge(limit, period, quota, tokens, now, team, scope))
        return Reservation.objects.create(
            team=team,
            tokens=tokens,
            buckets=buckets,
            counters=counters,
            created_at=now,
            expires_at=now + timedelta(seconds=settings.RESERVATION_TTL_SECONDS),
        )


def _draw(limit: Limit, tokens: int, now: datetime, scope: str) -> int:
    capacity, rate = int(limit.burst_tokens or 0), int(limit.tokens_per_minute or 0)
    if tokens > capacity:
        raise InvalidRequest(
            f"This request needs {tokens} tokens; the {scope}'s burst capacity is {capacity}.",
            code="request_exceeds_burst_capacity",
        )
    bucket = _bucket(limit, now)
    level, refilled_at = refilled(bucket, capacity, rate, now)
    if level < tokens:
        retry = math.ceil((tokens - level) * 60 / rate) if rate else 86_400
        _refuse(Refusal(f"{scope}_tokens_per_minute", capacity, level, retry))
    TokenBucket.objects.filter(pk=bucket.pk).update(level=level - tokens, refilled_at=refilled_at)
    return bucket.pk


def _bucket(limit: Limit, now: datetime) -> TokenBucket:
    try:
        with transaction.atomic():
            TokenBucket.objects.get_or_create(
                limit=limit, defaults={"level": limit.burst_tokens, "refilled_at": now}
            )
    except IntegrityError:
        pass  # created concurrently: lock it below
    return TokenBucket.objects.select_for_update().get(limit=limit)


def refilled(bucket: TokenBucket, capacity: int, rate: int, now: datetime) -> tuple[int, datetime]:
    """Whole tokens earned since the last refill; the clock moves by what they took, so
    fractions of a token are never lost or invented."""
    elapsed = max(0.0, (now - bucket.refilled_at).total_seconds())
    earned = int(elapsed * rate // 60) if rate else 0
    if bucket.level + earned >= capacity:
        return capacity, now
    return bucket.level + earned, bucket.refilled_at + timedelta(seconds=earned * 60 / rate)


def _charge(
    limit: Limit, period: str, quota: int, tokens: int, now: datetime, team: Team, scope: str
) -> int:
    starts_on, next_start = period_bounds(period, now, ZoneInfo(team.time_zone))
    counter, _ = _counter(limit, period, starts_on)
    moved = QuotaCounter.objects.filter(pk=counter.pk, used__lte=quota - tokens).update(
        used=F("used") + tokens
    )
    if not moved:
        counter.refresh_from_db(fields=["used"])
        retry = math.ceil((next_start - now).total_seconds())
        code = f"{scope}_quota_exceeded" if scope == "key" else "team_quota_exceeded"
        _refuse(Refusal(code, quota, max(0, quota - counter.used), retry))
    return counter.pk


def _counter(limit: Limit, period: str, starts_on: date) -> tuple[QuotaCounter, bool]:
    try:
        with transaction.atomic():
            return QuotaCounter.objects.get_or_create(
                limit=limit, period=period, starts_on=starts_on
            )
    except IntegrityError:
        return QuotaCounter.objects.get(limit=limit, period=period, starts_on=starts_on), False


def period_bounds(period: str, now: datetime, zone: ZoneInfo) -> tuple[date, datetime]:
    """The first day of the period containing ``now`` and when the next one starts."""
    today = now.astimezone(zone).date()
    if period == "day":
        start, following = today, today + timedelta(days=1)
    else:
        start = today.replace(day=1)
        following = (start + timedelta(days=32)).replace(day=1)
    return start, datetime.combine(following, time.min, tzinfo=zone)


def _refuse(refusal: Refusal) -> None:
    error = RateLimited(
        f"Token limit reached ({refusal.code}); retry in {refusal.retry_after} s.",
        code=refusal.code,
        headers={
            "Retry-After": str(refusal.retry_after),
            "x-ratelimit-limit-tokens": str(refusal.limit),
            "x-ratelimit-remaining-tokens": str(refusal.remaining),
            "x-ratelimit-reset-tokens": f"{refusal.retry_after}s",
        },
    )
    raise error


def budget_settle(*, reservation: Reservation, actual: int) -> None:
    """Replace the reservation with ``actual`` tokens: refund (or charge) the difference.

    Idempotent: a settled reservation is left alone. Call inside the transaction that
    writes the usage row.
    """
    with transaction.atomic():
        claimed = Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
            settled_at=timezone.now()
        )
        if not claimed:
            return
        difference = reservation.tokens - actual
        QuotaCounter.objects.filter(pk__in=reservation.counters).update(
            used=Greatest(F("used") - difference, 0)
        )
        for bucket in TokenBucket.objects.select_for_update().filter(pk__in=reservation.buckets):
            capacity = bucket.limit.burst_tokens or 0
            TokenBucket.objects.filter(pk=bucket.pk).update(
                level=Least(F("level") + difference, capacity)
            )


def reservations_release_expired(*, now: datetime | None = None) -> int:
    """Release reservations whose holder died before settling; their tokens were never
    used as far as anyone can tell."""
    now = now or timezone.now()
    released = 0
    for reservation in Reservation.objects.filter(settled_at__isnull=True, expires_at__lt=now):
        budget_settle(reservation=reservation, actual=0)
        released += 1
    return released
