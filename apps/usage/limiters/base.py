"""What every limiter shares: the buckets, slots and quotas it enforces, the refusal it
returns, and the integer refill arithmetic both stores keep (whole tokens earned since the
last refill, the refill clock moving only by what those tokens took)."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Protocol

from apps.usage.models import Limit
from apps.usage.values import NANOS_PER_USD

CONCURRENCY_RETRY_SECONDS = 1
TOKENS, USD = "tokens", "usd"
"""What a quota counts: tokens, or the cost of what was used, in nano-dollars."""


@dataclass(frozen=True)
class Bucket:
    limit_id: int
    capacity: int
    rate: int  # tokens per minute
    scope: str  # "team" or "key"


@dataclass(frozen=True)
class Slot:
    limit_id: int
    maximum: int
    scope: str
    kind: str = "streams"
    """What it counts: answer ``streams`` under a limit, or a team's open ``replays``
    (``limit_id`` is then the team's; only :class:`RedisLimiter` keeps those)."""


@dataclass(frozen=True)
class Refusal:
    code: str
    limit: int
    remaining: int
    retry_after: int
    unit: str = "tokens"

    def headers(self) -> dict[str, str]:
        """``Retry-After`` and the ``x-ratelimit-*`` headers of the 429 it becomes (a money
        budget's in dollars)."""
        return {
            "Retry-After": str(self.retry_after),
            f"x-ratelimit-limit-{self.unit}": self._shown(self.limit),
            f"x-ratelimit-remaining-{self.unit}": self._shown(self.remaining),
            f"x-ratelimit-reset-{self.unit}": f"{self.retry_after}s",
        }

    def _shown(self, amount: int) -> str:
        return f"{amount / NANOS_PER_USD:.6f}" if self.unit == USD else str(amount)


@dataclass(frozen=True)
class QuotaKey:
    """One period's counter of a limit: the same in the database and in Redis."""

    limit_id: int
    period: str  # "day" or "month"
    starts_on: date
    unit: str = TOKENS

    @property
    def name(self) -> str:
        """How a Redis reservation names it (its ``counters``, ``cost_counters``) and
        Redis keys it: the counter's row may not exist until something settles on it."""
        name = f"{self.limit_id}:{self.period}:{self.starts_on.isoformat()}"
        return name if self.unit == TOKENS else f"{name}:{self.unit}"

    @classmethod
    def named(cls, name: str) -> QuotaKey:
        """The quota a :attr:`name` names."""
        limit_id, period, starts_on, *unit = name.split(":")
        return cls(int(limit_id), period, date.fromisoformat(starts_on), *unit)


@dataclass(frozen=True)
class Quota:
    key: QuotaKey
    maximum: int
    scope: str
    resets_at: datetime

    def refusal(self, used: int, now: datetime) -> Refusal:
        retry = math.ceil((self.resets_at - now).total_seconds())
        remaining = max(0, self.maximum - used)
        if self.key.unit == USD:
            return Refusal("budget_exceeded", self.maximum, remaining, retry, USD)
        return Refusal(f"{self.scope}_quota_exceeded", self.maximum, remaining, retry)

    def amount(self, *, tokens: int, nanos: int) -> int:
        """What a request holding ``tokens`` costing ``nanos`` charges this quota."""
        return nanos if self.key.unit == USD else tokens


class LimiterUnavailable(Exception):
    """The store that enforces a limit cannot be reached."""


class QuotaUnseeded(Exception):
    """Redis has no counter for this quota yet: seed it from the database, then retry."""

    def __init__(self, quota: Quota) -> None:
        super().__init__(f"quota {quota.key} is not in Redis")
        self.quota = quota


class Limiter(Protocol):
    store: str

    def acquire(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        tokens: int,
        now: datetime,
    ) -> Refusal | None: ...

    def release(
        self,
        *,
        token: uuid.UUID,
        buckets: list[Bucket],
        slots: list[Slot],
        difference: int,
        now: datetime,
    ) -> None: ...

    def available(self, bucket: Bucket, now: datetime) -> int: ...


def bucket_refusal(bucket: Bucket, level: int, tokens: int) -> Refusal:
    """When the bucket will hold ``tokens`` again: exact, from its refill rate."""
    retry = math.ceil((tokens - level) * 60 / bucket.rate) if bucket.rate else 86_400
    return Refusal(f"{bucket.scope}_tokens_per_minute", bucket.capacity, max(level, 0), retry)


def slot_refusal(slot: Slot) -> Refusal:
    # A stream ends when it ends: there is no exact time, so ask again soon.
    return Refusal(
        "too_many_concurrent_streams", slot.maximum, 0, CONCURRENCY_RETRY_SECONDS, "streams"
    )


def refilled(
    level: int, refilled_at: datetime, *, capacity: int, rate: float, now: datetime
) -> tuple[int, datetime]:
    """Whole tokens earned since the last refill; the clock moves by what they took, so
    fractions of a token are never lost or invented."""
    elapsed = max(0.0, (now - refilled_at).total_seconds())
    earned = int(elapsed * rate // 60) if rate else 0
    if level + earned >= capacity:
        return capacity, now
    return level + earned, refilled_at + timedelta(seconds=earned * 60 / rate)


def buckets_and_slots(limit: Limit) -> tuple[Bucket | None, Slot | None]:
    scope = "key" if limit.api_key_id else "team"
    bucket = slot = None
    if limit.burst_tokens is not None and limit.tokens_per_minute is not None:
        bucket = Bucket(limit.pk, int(limit.burst_tokens), int(limit.tokens_per_minute), scope)
    if limit.max_concurrent_streams is not None:
        slot = Slot(limit.pk, int(limit.max_concurrent_streams), scope)
    return bucket, slot
