"""Settle: replace a reservation with what was really used, exactly once; and the periodic
job that releases what crashed processes left held and reconciles Redis with the record."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import cast

from django.db import DatabaseError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.core.group_commit import budget_writer
from apps.usage import metrics, statements
from apps.usage.budgets.counters import counter_record
from apps.usage.budgets.holds import (
    Hold,
    holds,
    reservation_buckets,
    reservation_quota_keys,
    reservation_slots,
)
from apps.usage.limiters import USD, LimiterUnavailable, QuotaKey, RedisLimiter, limiter
from apps.usage.models import QuotaCounter, Reservation
from apps.usage.values import nanos_of

logger = logging.getLogger(__name__)


def budget_settle(
    *,
    reservation: Reservation,
    actual: int,
    cost: Decimal = Decimal(0),
    now: datetime | None = None,
) -> None:
    """Replace the reservation with ``actual`` tokens costing ``cost`` USD: refund (or
    charge) the difference.

    Exactly once: a settled reservation is left alone. Call inside the transaction that
    writes the usage row; outside one, it commits with the settlements of other threads
    (:data:`apps.core.group_commit.budget_writer`). A Redis reservation whose row is not
    written yet is written here first; its Redis refund runs in the same transaction
    (marked pending if Redis is down, for the periodic job to retry).
    """
    budget_writer.run(_settle, reservation, actual, nanos_of(cost), now or timezone.now())


def _settle(reservation: Reservation, actual: int, nanos: int, now: datetime) -> None:
    """Called through the one writer, in a savepoint of its own (all or nothing)."""
    held = holds.get(reservation.token)
    remote = reservation.store != Reservation.Store.DATABASE
    if held is not None and held.deferred:
        statements.reservation_insert(reservation)
    claimed = statements.reservation_claim(reservation, now=now, actual=actual, actual_cost=nanos)
    if claimed is None:
        return
    tokens, cost_nanos = claimed
    difference = tokens - actual
    nanos = _within_hold(reservation, nanos, held=cost_nanos)
    # Counters charged at admission (by id: the database store, and Redis reservations
    # from before Redis counted quotas) give the difference back.
    charged = [c for c in reservation.counters if isinstance(c, int)]
    statements.quota_refund(charged, tokens=difference)
    costed = [c for c in reservation.cost_counters if isinstance(c, int)]
    statements.quota_refund(costed, tokens=cost_nanos - nanos)
    if not remote:
        limiter("database").release(
            token=reservation.token,
            buckets=held.buckets if held is not None else reservation_buckets(reservation),
            slots=held.slots if held is not None else reservation_slots(reservation),
            difference=difference,
            now=now,
        )
    else:
        # Under the counters' row locks until commit, so the periodic reconciliation
        # sees this settlement in both places or in neither.
        for key in reservation_quota_keys(reservation):
            counter_record(key, nanos if key.unit == USD else actual)
        used = Used(tokens=actual, nanos=nanos)
        if not _release_remote(reservation, held, difference=difference, used=used, now=now):
            Reservation.objects.filter(pk=reservation.pk).update(remote_pending=True)
    if held is not None:
        held.settled = True
    metrics.SETTLEMENTS.labels(reservation.kind).inc()


def _within_hold(reservation: Reservation, nanos: int, *, held: int) -> int:
    """What money budgets are charged: the actual cost, but never past what was held (the
    ledger keeps the actual cost). The hold is the worst case, so more means the tier
    reported more than was counted, or prices changed meanwhile: counted in
    ``ragtier_budget_overrun_nanodollars`` and logged, never let past a budget."""
    if nanos <= held or not reservation.cost_counters:
        return nanos
    metrics.BUDGET_OVERRUN.inc(nanos - held)
    logger.warning(
        "reservation %s cost %d nano-dollars, %d more than it held",
        reservation.pk,
        nanos,
        nanos - held,
    )
    return held


@dataclass(frozen=True, slots=True)
class Used:
    """What a settled reservation really used: tokens, and what they cost."""

    tokens: int
    nanos: int


def _release_remote(
    reservation: Reservation, held: Hold | None, *, difference: int, used: Used, now: datetime
) -> bool:
    """Give a settled reservation's tokens and slot back to Redis and turn its quota holds
    into what was ``used``; False if Redis is down. Redis does this once per reservation
    only."""
    try:
        cast(RedisLimiter, limiter(Reservation.Store.REDIS)).release(
            token=reservation.token,
            buckets=held.buckets if held is not None else reservation_buckets(reservation),
            slots=held.slots if held is not None else reservation_slots(reservation),
            difference=difference,
            now=now,
            quotas=reservation_quota_keys(reservation),
            actual=used.tokens,
            actual_nanos=used.nanos,
        )
    except LimiterUnavailable as exc:
        logger.warning("reservation %s: Redis refund deferred: %s", reservation.pk, exc)
        return False
    return True


def reservations_release_expired(*, now: datetime | None = None) -> int:
    """Release reservations whose holder died before settling (their tokens were never
    used as far as anyone can tell), retry Redis refunds that were deferred, and
    reconcile Redis's quota counters with the database."""
    now = now or timezone.now()
    released = 0
    for reservation in Reservation.objects.filter(settled_at__isnull=True, expires_at__lt=now):
        try:
            budget_settle(reservation=reservation, actual=0, now=now)
        except DatabaseError:  # one that cannot be released must not hold up the others
            logger.exception("reservation %s could not be released", reservation.pk)
            continue
        released += 1
    for reservation in Reservation.objects.filter(remote_pending=True):
        actual = int(reservation.actual_tokens or 0)
        nanos = min(int(reservation.actual_cost_nanos or 0), reservation.cost_nanos)
        used = Used(tokens=actual, nanos=nanos)
        if not _release_remote(
            reservation,
            None,
            difference=reservation.tokens - actual,
            used=used,
            now=reservation.settled_at or now,
        ):
            break  # still down: the next run tries again
        Reservation.objects.filter(pk=reservation.pk).update(remote_pending=False)
    quotas_reconcile(now=now)
    return released


def quotas_reconcile(*, now: datetime | None = None) -> int:
    """Redis's quota counters := the database's record (what settled) plus the holds of
    open reservations, holds past their expiry dropped (a process died before writing
    its reservation, or before settling it). Each counter's row is locked meanwhile, so a
    settlement lands before or after, never half. Returns the counters reconciled."""
    now = now or timezone.now()
    store = limiter()
    if not isinstance(store, RedisLimiter):
        return 0
    today = now.date()
    recent = QuotaCounter.objects.filter(
        Q(period="day", starts_on__gte=today - timedelta(days=1))
        | Q(period="month", starts_on__gte=today - timedelta(days=32))
    )
    done = 0
    for counter_id in recent.values_list("pk", flat=True):
        with transaction.atomic():
            counter = QuotaCounter.objects.select_for_update().get(pk=counter_id)
            key = QuotaKey(counter.limit_id, counter.period, counter.starts_on, counter.unit)
            try:
                store.quota_used(key, now, record=counter.used)
            except LimiterUnavailable as exc:
                logger.warning("quota reconciliation deferred: %s", exc)
                return done
        done += 1
    return done
