"""Quota periods: where a day's or a month's quota starts and ends in a team's time zone,
and the name a Redis reservation gives a quota it charged."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from apps.usage.limiters import QuotaKey


def period_bounds(period: str, now: datetime, zone: ZoneInfo) -> tuple[date, datetime]:
    """The first day of the period containing ``now`` and when the next one starts."""
    today = now.astimezone(zone).date()
    if period == "day":
        start, following = today, today + timedelta(days=1)
    else:
        start = today.replace(day=1)
        following = (start + timedelta(days=32)).replace(day=1)
    return start, datetime.combine(following, time.min, tzinfo=zone)


def quota_name(key: QuotaKey) -> str:
    """How a Redis reservation names a quota it charged (:attr:`QuotaKey.name`)."""
    return key.name


def quota_key(name: str) -> QuotaKey:
    """The quota a :func:`quota_name` names."""
    return QuotaKey.named(name)
