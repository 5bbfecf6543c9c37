"""What a reservation holds: known to the process that took it, read back from its row by
any other."""

from __future__ import annotations

import uuid
import weakref
from dataclasses import dataclass

from apps.usage.limiters import Bucket, Quota, QuotaKey, Slot, buckets_and_slots
from apps.usage.models import Limit, Reservation
from apps.usage.periods import quota_key


@dataclass
class Hold:
    """What this process knows of a reservation it took: enough to extend and settle it
    without reading the limits again and, for Redis, whether its row may not be written
    yet (``deferred``: this object is the record until it is)."""

    buckets: list[Bucket]
    slots: list[Slot]
    quotas: list[Quota]
    deferred: bool
    written: bool = False
    settled: bool = False


holds: dict[uuid.UUID, Hold] = {}
"""The reservations this process took, by token (each gone with the object it returned)."""


def hold_keep(reservation: Reservation, held: Hold) -> None:
    holds[reservation.token] = held
    weakref.finalize(reservation, holds.pop, reservation.token, None)


def reservation_buckets(reservation: Reservation) -> list[Bucket]:
    found: list[Bucket] = []
    for limit in Limit.objects.filter(pk__in=reservation.buckets):
        bucket, _ = buckets_and_slots(limit)
        if bucket is not None:
            found.append(bucket)
    return found


def reservation_slots(reservation: Reservation) -> list[Slot]:
    # Releasing a slot needs only the limit it belongs to.
    return [Slot(limit_id, 0, "") for limit_id in reservation.slots]


def reservation_quota_keys(reservation: Reservation) -> list[QuotaKey]:
    """The quotas (and money budgets) a Redis reservation charged in Redis (by name)."""
    names = [*reservation.counters, *reservation.cost_counters]
    return [quota_key(name) for name in names if isinstance(name, str)]
