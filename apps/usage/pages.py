"""What the usage pages show (the team's page at /usage and the admin's per team): tokens
per day by kind as a chart drawn server side, its numbers, the share of answers that ran
near the window limit, and the quotas left."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.utils import timezone

from apps.accounts.models import ApiKey, Team
from apps.usage.charts import PALETTE, ChartPoint, Series, stacked_bar_chart
from apps.usage.saturation import context_saturation
from apps.usage.selectors import quota_report, usage_daily_by_kind

USAGE_DAYS = 30
USAGE_DAYS_MAX = 366
KIND_COLORS = {"chat": PALETTE[0], "embedding": PALETTE[1]}
QUOTA_PART_NAMES = {"bucket": "token bucket", "day": "daily quota", "month": "monthly quota"}
QUOTA_HIGHLIGHTS = {"remaining", "available"}


def usage_days(raw: str | None) -> int:
    """The ``days`` query parameter, kept within ``[1, USAGE_DAYS_MAX]``."""
    try:
        days = int(raw) if raw else USAGE_DAYS
    except ValueError:
        days = USAGE_DAYS
    return min(max(days, 1), USAGE_DAYS_MAX)


def team_usage_page(*, team: Team, days: int) -> dict[str, Any]:
    """What the team usage page shows: the chart, its numbers, and the quotas left."""
    end = timezone.now().astimezone(ZoneInfo(team.time_zone)).date()
    start = end - timedelta(days=days - 1)
    daily = usage_daily_by_kind(team=team, start=start, end=end)
    kinds = list(daily[0]["tokens"])
    series = [
        Series(kind, KIND_COLORS.get(kind, PALETTE[index % len(PALETTE)]))
        for index, kind in enumerate(kinds)
    ]
    chart = stacked_bar_chart(
        series=series,
        points=[
            ChartPoint(row["day"].isoformat(), row["day"].strftime("%m-%d"), row["tokens"])
            for row in daily
        ],
        x_title=f"day ({team.time_zone})",
        y_title="tokens",
    )
    totals = {kind: sum(row["tokens"][kind] for row in daily) for kind in kinds}
    team_quota = quota_report(team=team, api_key=None)
    keys = ApiKey.objects.filter(team=team, limit__isnull=False).order_by("created_at")
    key_quotas = [
        {
            "key": key,
            "entries": [
                _quota_entry(entry)
                for entry in quota_report(team=team, api_key=key)["limits"]
                if entry["scope"].startswith("key ")
            ],
        }
        for key in keys
    ]
    return {
        "days": days,
        "day_choices": [7, 30, 90, USAGE_DAYS_MAX],
        "start": start,
        "end": end,
        "kinds": kinds,
        "chart": chart,
        "daily": [
            {
                "day": row["day"],
                "values": [row["tokens"][kind] for kind in kinds],
                "total": sum(row["tokens"].values()),
            }
            for row in daily
        ],
        "totals": [totals[kind] for kind in kinds],
        "grand_total": sum(totals.values()),
        "team_unlimited": team_quota["unlimited"],
        "team_quotas": [_quota_entry(entry) for entry in team_quota["limits"]],
        "key_quotas": key_quotas,
        "saturation": context_saturation(
            team=team, start=start, end=end, threshold=settings.USAGE_SATURATION_THRESHOLD
        ),
    }


def _quota_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One entry of ``quota_report`` as named parts, whatever keys it has: a dict value
    becomes a list of fields (None there: not known now, e.g. the limiter is unreachable),
    a scalar one value, None (not limited) nothing."""
    parts = []
    for name, value in entry.items():
        if name == "scope" or value is None:
            continue
        part: dict[str, Any] = {
            "name": QUOTA_PART_NAMES.get(name, name.replace("_", " ")),
            "fields": None,
            "value": None,
        }
        if isinstance(value, Mapping):
            part["fields"] = [
                {
                    "name": str(field).replace("_", " "),
                    "value": "unknown" if item is None else item,
                    "highlight": field in QUOTA_HIGHLIGHTS,
                }
                for field, item in value.items()
            ]
        else:
            part["value"] = value
        parts.append(part)
    return {"scope": entry.get("scope", ""), "parts": parts}
