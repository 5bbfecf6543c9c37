"""Token budgets: reserve before calling the model, settle on actual usage.

Reserve is one atomic, all-or-nothing step over every limit that applies (the team's and
the key's). Period quotas always live in the database and move by a conditional
``UPDATE … SET used = used + n WHERE used + n <= limit``; token buckets and stream slots
live in the limiter's store (:mod:`apps.usage.limiters`: locked rows in the database, or
one Lua script in Redis, called last so that its refusal rolls the quotas back with the
transaction). Nothing is read and then written unlocked, so concurrent requests can never
overspend. A refusal says when to retry.

Settling replaces the reservation with what was really used and refunds the difference.
Reservations a crashed process never settled expire and are released by a periodic job,
which also retries Redis refunds that found Redis down. When Redis is unreachable at
admission, requests fail closed with 503 unless ``RATE_LIMIT_REDIS_FALLBACK`` is
``database``: then the database enforces the buckets and slots until Redis returns.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterable
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Greatest
from django.utils import timezone

from apps.accounts.models import ApiKey, Team
from apps.core.exceptions import ApplicationError, InvalidRequest
from apps.usage import metrics
from apps.usage.limiters import (
    Bucket,
    Limiter,
    LimiterUnavailable,
    Refusal,
    Slot,
    buckets_and_slots,
    limiter,
)
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord

logger = logging.getLogger(__name__)

LIMITER_RETRY_SECONDS = 5


class RateLimited(ApplicationError):
    status, type, code = 429, "rate_limit_error", "team_tokens_per_minute"


class AdmissionUnavailable(ApplicationError):
    """The store that enforces a limit is down: fail closed rather than let requests
    through unchecked."""

    status, type, code = 503, "overloaded", "rate_limiter_unavailable"


def limits_of(*, team: Team, api_key: ApiKey | None) -> QuerySet[Limit]:
    """The limits that apply to a caller: the team's, and the key's when there is one."""
    if api_key is None:
        return Limit.objects.filter(team=team, api_key__isnull=True)
    return Limit.objects.filter(Q(team=team, api_key__isnull=True) | Q(api_key=api_key))


def max_tokens_cap(*, limits: Iterable[Limit]) -> int | None:
    """The tightest ``max_tokens`` cap of a caller's limits; None when there is none."""
    known = [int(limit.max_tokens) for limit in limits if limit.max_tokens is not None]
    return min(known) if known else None


def budget_reserve(
    *,
    team: Team,
    api_key: ApiKey | None,
    tokens: int,
    kind: str = UsageRecord.Kind.CHAT,
    now: datetime | None = None,
    limits: list[Limit] | None = None,
) -> Reservation:
    """Hold ``tokens`` against every limit of ``team`` and ``api_key``, or raise 429.

    A chat generation draws on token buckets, takes a stream slot and charges the period
    quotas; an embedding job (``kind="embedding"``) charges the period quotas only.
    ``limits``: the caller's, when already read (see :func:`limits_of`).
    """
    now = now or timezone.now()
    if limits is None:
        limits = list(limits_of(team=team, api_key=api_key))
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    if kind == UsageRecord.Kind.CHAT:
        for limit in limits:
            bucket, slot = buckets_and_slots(limit)
            if bucket is not None:
                if tokens > bucket.capacity:
                    raise InvalidRequest(
                        f"This request needs {tokens} tokens; the {bucket.scope}'s burst "
                        f"capacity is {bucket.capacity}.",
                        code="request_exceeds_burst_capacity",
                    )
                buckets.append(bucket)
            if slot is not None:
                slots.append(slot)
    store = limiter()
    try:
        return _reserve(team, api_key, kind, tokens, limits, buckets, slots, store, now)
    except LimiterUnavailable as exc:
        if settings.RATE_LIMIT_REDIS_FALLBACK != "database":
            metrics.ADMISSION_UNAVAILABLE.inc()
            logger.warning("admission refused, the limiter is down: %s", exc)
            raise AdmissionUnavailable(
                "Rate limits cannot be checked right now; retry shortly.",
                headers={"Retry-After": str(LIMITER_RETRY_SECONDS)},
            ) from exc
        logger.warning("the limiter is down, enforcing from the database: %s", exc)
        store = limiter("database")
        return _reserve(team, api_key, kind, tokens, limits, buckets, slots, store, now)


def _reserve(
    team: Team,
    api_key: ApiKey | None,
    kind: str,
    tokens: int,
    limits: list[Limit],
    buckets: list[Bucket],
    slots: list[Slot],
    store: Limiter,
    now: datetime,
) -> Reservation:
    token = uuid.uuid4()
    if not (buckets or slots):
        store = limiter("database")  # quotas only: nothing to hold elsewhere
    remote = store.store != Reservation.Store.DATABASE
    acquired = False
    try:
        with transaction.atomic():
            counters = [
                _charge(limit, period, quota, tokens, now, team)
                for limit in limits
                for period, quota in (("day", limit.daily_tokens), ("month", limit.monthly_tokens))
                if quota is not None
            ]
            reservation = Reservation.objects.create(
                team=team,
                api_key=api_key,
                kind=kind,
                token=token,
                tokens=tokens,
                store=store.store,
                buckets=[b.limit_id for b in buckets],
                slots=[s.limit_id for s in slots],
                counters=counters,
                created_at=now,
                expires_at=now + timedelta(seconds=settings.RESERVATION_TTL_SECONDS),
            )
            # Last, so that a refusal here rolls the quota charges back with the rest.
            refusal = store.acquire(
                token=token, buckets=buckets, slots=slots, tokens=tokens, now=now
            )
            if refusal is not None:
                _refuse(refusal)
            acquired = remote
    except BaseException:
        if acquired:  # the transaction failed after Redis said yes: give it back
            store.release(token=token, buckets=buckets, slots=slots, difference=tokens, now=now)
        raise
    metrics.RESERVATIONS.labels(kind).inc()
    return reservation


def _charge(limit: Limit, period: str, quota: int, tokens: int, now: datetime, team: Team) -> int:
    starts_on, next_start = period_bounds(period, now, ZoneInfo(team.time_zone))
    counter = _counter(limit, period, starts_on)
    moved = QuotaCounter.objects.filter(pk=counter.pk, used__lte=quota - tokens).update(
        used=F("used") + tokens
    )
    if not moved:
        counter.refresh_from_db(fields=["used"])
        retry = math.ceil((next_start - now).total_seconds())
        code = "key_quota_exceeded" if limit.api_key_id else "team_quota_exceeded"
        _refuse(Refusal(code, quota, max(0, quota - counter.used), retry))
    return counter.pk


def _counter(limit: Limit, period: str, starts_on: date) -> QuotaCounter:
    try:
        with transaction.atomic():
            return QuotaCounter.objects.get_or_create(
                limit=limit, period=period, starts_on=starts_on
            )[0]
    except IntegrityError:
        return QuotaCounter.objects.get(limit=limit, period=period, starts_on=starts_on)


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
    metrics.RATE_LIMITED.labels(refusal.code).inc()
    unit = refusal.unit
    raise RateLimited(
        f"Limit reached ({refusal.code}); retry in {refusal.retry_after} s.",
        code=refusal.code,
        headers={
            "Retry-After": str(refusal.retry_after),
            f"x-ratelimit-limit-{unit}": str(refusal.limit),
            f"x-ratelimit-remaining-{unit}": str(refusal.remaining),
            f"x-ratelimit-reset-{unit}": f"{refusal.retry_after}s",
        },
    )


def budget_extend(*, reservation: Reservation, tokens: int, now: datetime | None = None) -> None:
    """Hold ``tokens`` more on an open reservation, against the same buckets and quota
    counters, all or nothing; raise 429 (the reservation unchanged) if they do not fit."""
    if tokens <= 0:
        return
    now = now or timezone.now()
    store = limiter(reservation.store)
    buckets = _buckets(reservation)
    acquired = False
    try:
        with transaction.atomic():
            counters = QuotaCounter.objects.filter(pk__in=reservation.counters)
            for counter in counters.select_related("limit"):
                limit = counter.limit
                quota = limit.daily_tokens if counter.period == "day" else limit.monthly_tokens
                if quota is None:
                    continue  # the limit was lifted meanwhile
                moved = QuotaCounter.objects.filter(pk=counter.pk, used__lte=quota - tokens).update(
                    used=F("used") + tokens
                )
                if not moved:
                    counter.refresh_from_db(fields=["used"])
                    _, next_start = period_bounds(
                        counter.period, now, ZoneInfo(reservation.team.time_zone)
                    )
                    retry = math.ceil((next_start - now).total_seconds())
                    code = (
                        "key_quota_exceeded" if counter.limit.api_key_id else "team_quota_exceeded"
                    )
                    _refuse(Refusal(code, quota, max(0, quota - counter.used), retry))
            moved = Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
                tokens=F("tokens") + tokens
            )
            if not moved:
                raise InvalidRequest("the reservation is already settled")
            refusal = store.acquire(
                token=reservation.token, buckets=buckets, slots=[], tokens=tokens, now=now
            )
            if refusal is not None:
                _refuse(refusal)
            acquired = store.store != "database" and bool(buckets)
    except BaseException:
        if acquired:
            store.release(token=uuid.uuid4(), buckets=buckets, slots=[], difference=tokens, now=now)
        raise
    reservation.tokens += tokens


def _buckets(reservation: Reservation) -> list[Bucket]:
    found: list[Bucket] = []
    for limit in Limit.objects.filter(pk__in=reservation.buckets):
        bucket, _ = buckets_and_slots(limit)
        if bucket is not None:
            found.append(bucket)
    return found


def _slots(reservation: Reservation) -> list[Slot]:
    # Releasing a slot needs only the limit it belongs to.
    return [Slot(limit_id, 0, "") for limit_id in reservation.slots]


def budget_settle(*, reservation: Reservation, actual: int, now: datetime | None = None) -> None:
    """Replace the reservation with ``actual`` tokens: refund (or charge) the difference.

    Idempotent: a settled reservation is left alone. Call inside the transaction that
    writes the usage row; a Redis refund runs once that transaction commits (marked
    pending until it has, so the periodic job retries it if Redis was down).
    """
    now = now or timezone.now()
    with transaction.atomic():
        claimed = Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
            settled_at=now,
            actual_tokens=actual,
            remote_pending=reservation.store != Reservation.Store.DATABASE,
        )
        if not claimed:
            return
        tokens = Reservation.objects.values_list("tokens", flat=True).get(pk=reservation.pk)
        difference = tokens - actual
        QuotaCounter.objects.filter(pk__in=reservation.counters).update(
            used=Greatest(F("used") - difference, 0)
        )
        if reservation.store == Reservation.Store.DATABASE:
            limiter("database").release(
                token=reservation.token,
                buckets=_buckets(reservation),
                slots=_slots(reservation),
                difference=difference,
                now=now,
            )
        else:
            transaction.on_commit(lambda: _release_remote(reservation.pk))
    metrics.SETTLEMENTS.labels(reservation.kind).inc()


def _release_remote(reservation_id: int) -> bool:
    """Give a settled reservation's tokens and slots back to Redis; False if Redis is down
    (it stays pending for the periodic job). Redis releases each reservation once only."""
    reservation = Reservation.objects.filter(pk=reservation_id, remote_pending=True).first()
    if reservation is None:
        return True
    try:
        limiter(reservation.store).release(
            token=reservation.token,
            buckets=_buckets(reservation),
            slots=_slots(reservation),
            difference=reservation.tokens - int(reservation.actual_tokens or 0),
            now=reservation.settled_at or timezone.now(),
        )
    except LimiterUnavailable as exc:
        logger.warning("reservation %s: Redis refund deferred: %s", reservation_id, exc)
        return False
    Reservation.objects.filter(pk=reservation_id).update(remote_pending=False)
    return True


def reservations_release_expired(*, now: datetime | None = None) -> int:
    """Release reservations whose holder died before settling (their tokens were never
    used as far as anyone can tell) and retry Redis refunds that were deferred."""
    now = now or timezone.now()
    released = 0
    for reservation in Reservation.objects.filter(settled_at__isnull=True, expires_at__lt=now):
        budget_settle(reservation=reservation, actual=0, now=now)
        released += 1
    for reservation_id in Reservation.objects.filter(remote_pending=True).values_list(
        "pk", flat=True
    ):
        if not _release_remote(reservation_id):
            break  # still down: the next run tries again
    return released
