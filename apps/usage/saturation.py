"""Reads of how full the answers' windows ran: of a team's chat answers, those whose
prompt took at least a share (``USAGE_SATURATION_THRESHOLD``) of the served model's
context window, per day and over a range. The usage pages show it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from django.db.models import BigIntegerField, Count, F, QuerySet
from django.db.models.functions import Cast, TruncDate
from django.db.models.lookups import GreaterThanOrEqual

from apps.accounts.models import Team
from apps.usage.models import UsageRecord

BASIS = 10_000
"""The threshold in parts of this many, compared in integers: 0.9 of a 100-token window
is 90 tokens exactly, not 90.00000000000001."""


@dataclass(frozen=True)
class Saturation:
    """Of ``answers`` (chat answers that filled a window: not the response cache's),
    ``near_limit`` filled at least the threshold of it."""

    answers: int
    near_limit: int

    @property
    def share(self) -> float:
        return self.near_limit / self.answers if self.answers else 0.0

    @property
    def percent(self) -> float:
        return round(self.share * 100, 1)


@dataclass(frozen=True)
class DaySaturation(Saturation):
    day: date


@dataclass(frozen=True)
class SaturationReport:
    threshold: float
    total: Saturation
    daily: list[DaySaturation]
    """The days with answers, oldest first."""

    @property
    def threshold_percent(self) -> float:
        return round(self.threshold * 100, 1)


def context_saturation(*, team: Team, start: date, end: date, threshold: float) -> SaturationReport:
    """``team``'s answers of ``[start, end]`` (whole days in its time zone) near the
    window limit: prompt tokens at or above ``threshold`` of the context window."""
    zone = ZoneInfo(team.time_zone)
    answers = _answers(team=team, start=start, end=end, zone=zone)
    rows = (
        answers.annotate(day=TruncDate("created_at", tzinfo=zone))
        .values("day")
        .annotate(answers=Count("pk"), near_limit=Count("pk", filter=_near_limit(threshold)))
        .order_by("day")
    )
    daily = [
        DaySaturation(day=r["day"], answers=r["answers"], near_limit=r["near_limit"]) for r in rows
    ]
    total = Saturation(
        answers=sum(d.answers for d in daily), near_limit=sum(d.near_limit for d in daily)
    )
    return SaturationReport(threshold=threshold, total=total, daily=daily)


def _answers(*, team: Team, start: date, end: date, zone: ZoneInfo) -> QuerySet[UsageRecord]:
    since = datetime.combine(start, time.min, tzinfo=zone)
    until = datetime.combine(end + timedelta(days=1), time.min, tzinfo=zone)
    return UsageRecord.objects.filter(
        team=team,
        kind=UsageRecord.Kind.CHAT,
        cache_hit=False,
        context_window__gt=0,
        created_at__gte=since,
        created_at__lt=until,
    )


def _near_limit(threshold: float) -> GreaterThanOrEqual:
    """prompt / window >= threshold, as prompt * BASIS >= window * (threshold * BASIS)
    in 64-bit integers (a window of a million tokens times BASIS overflows 32 bits)."""
    window = Cast(F("context_window"), BigIntegerField())
    return GreaterThanOrEqual(F("prompt_tokens") * BASIS, window * round(threshold * BASIS))
