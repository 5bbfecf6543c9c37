"""Extend: hold more tokens on an open reservation, all or nothing, against the buckets
and quotas it already holds."""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime
from zoneinfo import ZoneInfo

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.core.exceptions import InvalidRequest
from apps.usage.budgets.holds import Hold, holds, reservation_buckets, reservation_quota_keys
from apps.usage.budgets.refusals import refuse
from apps.usage.budgets.reserve import redis_admit
from apps.usage.limiters import LimiterUnavailable, Quota, QuotaKey, RedisLimiter, limiter
from apps.usage.models import Limit, QuotaCounter, Reservation
from apps.usage.periods import period_bounds


def budget_extend(*, reservation: Reservation, tokens: int, now: datetime | None = None) -> None:
    """Hold ``tokens`` more on an open reservation, against the same buckets and quota
    counters, all or nothing; raise 429 (the reservation unchanged) if they do not fit.

    A reservation past its expiry cannot grow: its holder is presumed gone, and Redis has
    already dropped its hold, so an extension checked against what is left would let its
    settlement charge the whole reservation past the quota."""
    if tokens <= 0:
        return
    now = now or timezone.now()
    if reservation.expires_at <= now:
        raise InvalidRequest("the reservation has expired")
    if reservation.store == Reservation.Store.REDIS:
        _extend_remote(reservation, tokens, now)
        return
    store = limiter(reservation.store)
    buckets = reservation_buckets(reservation)
    with transaction.atomic():
        counters = QuotaCounter.objects.filter(pk__in=reservation.counters)
        for counter in counters.select_related("limit"):
            key = QuotaKey(counter.limit_id, counter.period, counter.starts_on)
            quota = _quota_of(counter.limit, key, reservation=reservation, now=now)
            if quota is not None and not QuotaCounter.objects.filter(
                pk=counter.pk, used__lte=quota.maximum - tokens
            ).update(used=F("used") + tokens):
                counter.refresh_from_db(fields=["used"])
                refuse(quota.refusal(counter.used, now))
        moved = Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
            tokens=F("tokens") + tokens
        )
        if not moved:
            raise InvalidRequest("the reservation is already settled")
        refusal = store.acquire(
            token=reservation.token, buckets=buckets, slots=[], tokens=tokens, now=now
        )
        if refusal is not None:
            refuse(refusal)
    reservation.tokens += tokens


def _extend_remote(reservation: Reservation, tokens: int, now: datetime) -> None:
    store = limiter(Reservation.Store.REDIS)
    assert isinstance(store, RedisLimiter)  # noqa: S101 - limiter("redis") is one
    held = holds.get(reservation.token)
    if held is None:  # taken by another process: read what it holds
        held = Hold(
            reservation_buckets(reservation), [], _quotas_of(reservation, now), deferred=False
        )
    if held.settled:
        raise InvalidRequest("the reservation is already settled")
    extension = Hold(held.buckets, [], held.quotas, deferred=False)
    refusal = redis_admit(
        store,
        team=reservation.team,
        token=reservation.token,
        held=extension,
        tokens=tokens,
        now=now,
        expires_at=reservation.expires_at,
    )
    if refusal is not None:
        refuse(refusal)
    try:
        if held.deferred:  # the row is this object until written
            reservation.tokens += tokens
            if held.written:
                Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
                    tokens=reservation.tokens
                )
            return
        if not Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
            tokens=F("tokens") + tokens
        ):
            raise InvalidRequest("the reservation is already settled")
    except BaseException:
        # The buckets get the tokens back; the quota holds stay as they are until the
        # reservation settles (which drops them whole): never less than what is held.
        with contextlib.suppress(LimiterUnavailable):
            store.release(
                token=uuid.uuid4(), buckets=held.buckets, slots=[], difference=tokens, now=now
            )
        raise
    reservation.tokens += tokens


def _quota_of(
    limit: Limit, key: QuotaKey, *, reservation: Reservation, now: datetime
) -> Quota | None:
    """The quota ``key`` of ``limit`` counts against; None if the limit was lifted."""
    maximum = limit.daily_tokens if key.period == "day" else limit.monthly_tokens
    if maximum is None:
        return None
    _, resets_at = period_bounds(key.period, now, ZoneInfo(reservation.team.time_zone))
    return Quota(key, int(maximum), "key" if limit.api_key_id else "team", resets_at)


def _quotas_of(reservation: Reservation, now: datetime) -> list[Quota]:
    """The quotas a Redis reservation taken by another process charged."""
    keys = reservation_quota_keys(reservation)
    limits = Limit.objects.in_bulk([key.limit_id for key in keys])
    found = [
        _quota_of(limits[key.limit_id], key, reservation=reservation, now=now)
        for key in keys
        if key.limit_id in limits
    ]
    return [quota for quota in found if quota is not None]
