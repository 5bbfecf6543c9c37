"""Token buckets and stream slots as database rows, locked or conditionally updated inside
the caller's transaction."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from apps.usage import statements
from apps.usage.limiters.base import Bucket, Refusal, Slot, bucket_refusal, refilled, slot_refusal
from apps.usage.models import StreamCounter, TokenBucket


class DatabaseLimiter:
    """Buckets and stream counters as rows, locked or conditionally updated in the
    caller's transaction (SQLite's IMMEDIATE transactions serialise writers)."""

    store = "database"

    def acquire(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        tokens: int,
        now: datetime,
    ) -> Refusal | None:
        for bucket in buckets:
            pk, level, refilled_at = _locked_bucket(bucket, now)
            level, refilled_at = refilled(
                level, refilled_at, capacity=bucket.capacity, rate=bucket.rate, now=now
            )
            if level < tokens:
                return bucket_refusal(bucket, level, tokens)
            statements.bucket_set(pk, level=level - tokens, refilled_at=refilled_at)
        for slot in slots:
            if not statements.slot_take(slot.limit_id, maximum=slot.maximum):
                _get_or_create(StreamCounter, limit_id=slot.limit_id)  # the first stream
                if not statements.slot_take(slot.limit_id, maximum=slot.maximum):
                    return slot_refusal(slot)
        return None

    def release(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        difference: int,
        now: datetime,
    ) -> None:
        for bucket in buckets:
            statements.bucket_refund(bucket.limit_id, tokens=difference, capacity=bucket.capacity)
        statements.slots_free([slot.limit_id for slot in slots])

    def available(self, bucket: Bucket, now: datetime) -> int:
        row = TokenBucket.objects.filter(limit_id=bucket.limit_id).first()
        if row is None:
            return bucket.capacity
        return refilled(
            row.level, row.refilled_at, capacity=bucket.capacity, rate=bucket.rate, now=now
        )[0]


def _locked_bucket(bucket: Bucket, now: datetime) -> tuple[int, int, datetime]:
    """The bucket's row (id, level, last refill), locked; made full if it is the first."""
    row = statements.bucket_row(bucket.limit_id)
    if row is not None:
        return row
    _get_or_create(
        TokenBucket,
        limit_id=bucket.limit_id,
        defaults={"level": bucket.capacity, "refilled_at": now},
    )
    row = statements.bucket_row(bucket.limit_id)
    assert row is not None  # noqa: S101 - made just above
    return row


def _get_or_create(model: Any, *, defaults: dict[str, Any] | None = None, **lookup: Any) -> Any:
    try:
        with transaction.atomic():
            return model.objects.get_or_create(defaults=defaults, **lookup)[0]
    except IntegrityError:  # created concurrently
        return model.objects.get(**lookup)
