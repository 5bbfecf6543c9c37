"""What a request bucket is, and when a refused request may come back.

A bucket holds whole requests, up to its burst, refilled at a steady rate with the token
limiters' integer arithmetic (:func:`apps.usage.limiters.base.refilled`: whole requests earned
since the last refill, the refill clock moving only by what they took). Every request
takes one from each bucket that applies to it, all or nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from apps.usage.limiters import Refusal

REQUESTS_CODE = "rate_limited"


@dataclass(frozen=True)
class RequestBucket:
    name: str  # "requests:<team id>", or "<throttle scope>:<team id>"
    capacity: int  # the burst
    rate: float  # requests per minute (the token buckets' unit)


def request_refusal(
    bucket: RequestBucket, *, level: int, refilled_at: datetime, now: datetime
) -> Refusal:
    """Exact: the bucket holds a request again one refill step after its refill clock,
    less what has passed since (whole seconds, rounded up: never too early)."""
    due = refilled_at + timedelta(seconds=(1 - level) * 60 / bucket.rate)
    retry = max(1, math.ceil((due - now).total_seconds()))
    return Refusal(REQUESTS_CODE, bucket.capacity, max(level, 0), retry, "requests")


class RequestLimiter(Protocol):
    store: str

    def take(self, buckets: list[RequestBucket], *, now: datetime) -> Refusal | None:
        """One request from every bucket, or none and the first refusal."""
        ...
