"""Extend: hold more tokens on an open reservation, all or nothing, against the buckets
and quotas it already holds."""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.core.exceptions import InvalidRequest
from apps.usage.budgets.holds import Hold, holds, reservation_buckets, reservation_quota_keys
from apps.usage.budgets.refusals import refuse
from apps.usage.budgets.reserve import redis_admit
from apps.usage.limiters import LimiterUnavailable, Quota, QuotaKey, RedisLimiter, limiter
from apps.usage.limits import limit_periods
from apps.usage.models import Limit, QuotaCounter, Reservation
from apps.usage.periods import period_bounds
from apps.usage.values import nanos_of


def budget_extend(
    *,
    reservation: Reservation,
    tokens: int,
    cost: Decimal = Decimal(0),
    now: datetime | None = None,
) -> None:
    """Hold ``tokens`` more, costing ``cost`` USD more, on an open reservation, against the
    same buckets, quota counters and money budgets, all or nothing; raise 429 (the
    reservation unchanged) if they do not fit.

    A reservation past its expiry cannot grow: its holder is presumed gone, and Redis has
    already dropped its hold, so an extension checked against what is left would let its
    settlement charge the whole reservation past the quota."""
    tokens, nanos = max(tokens, 0), max(nanos_of(cost), 0)
    if not tokens and not nanos:
        return
    now = now or timezone.now()
    if reservation.expires_at <= now:
        raise InvalidRequest("the reservation has expired")
    if reservation.store == Reservation.Store.REDIS:
        _extend_remote(reservation, tokens, nanos, now)
        return
    store = limiter(reservation.store)
    buckets = reservation_buckets(reservation)
    with transaction.atomic():
        ids = [*reservation.counters, *reservation.cost_counters]
        for counter in QuotaCounter.objects.filter(pk__in=ids).select_related("limit"):
            key = QuotaKey(counter.limit_id, counter.period, counter.starts_on, counter.unit)
            quota = _quota_of(counter.limit, key, reservation=reservation, now=now)
            more = quota.amount(tokens=tokens, nanos=nanos) if quota is not None else 0
            if quota is not None and not QuotaCounter.objects.filter(
                pk=counter.pk, used__lte=quota.maximum - more
            ).update(used=F("used") + more):
                counter.refresh_from_db(fields=["used"])
                refuse(quota.refusal(counter.used, now))
        moved = Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
            tokens=F("tokens") + tokens, cost_nanos=F("cost_nanos") + nanos
        )
        if not moved:
            raise InvalidRequest("the reservation is already settled")
        refusal = store.acquire(
            token=reservation.token, buckets=buckets, slots=[], tokens=tokens, now=now
        )
        if refusal is not None:
            refuse(refusal)
    reservation.tokens += tokens
    reservation.cost_nanos += nanos


def _extend_remote(reservation: Reservation, tokens: int, nanos: int, now: datetime) -> None:
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
        nanos=nanos,
        now=now,
        expires_at=reservation.expires_at,
    )
    if refusal is not None:
        refuse(refusal)
    try:
        if held.deferred:  # the row is this object until written
            reservation.tokens += tokens
            reservation.cost_nanos += nanos
            if held.written:
                Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
                    tokens=reservation.tokens, cost_nanos=reservation.cost_nanos
                )
            return
        if not Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
            tokens=F("tokens") + tokens, cost_nanos=F("cost_nanos") + nanos
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
    reservation.cost_nanos += nanos


def _quota_of(
    limit: Limit, key: QuotaKey, *, reservation: Reservation, now: datetime
) -> Quota | None:
    """The quota ``key`` of ``limit`` counts against; None if the limit was lifted."""
    maximum = next(
        (
            most
            for period, unit, most in limit_periods(limit)
            if (period, unit) == (key.period, key.unit)
        ),
        None,
    )
    if maximum is None:
        return None
    _, resets_at = period_bounds(key.period, now, ZoneInfo(reservation.team.time_zone))
    return Quota(key, maximum, "key" if limit.api_key_id else "team", resets_at)


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
