"""Reads of the token ledger."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db.models import Count, F, Sum
from django.db.models.functions import TruncDate

from apps.accounts.models import Team
from apps.usage.models import UsageRecord

GROUPS = {
    "day": "day",
    "model": "model",
    "key": "api_key__prefix",
    "kind": "kind",
}
TOKEN_FIELDS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")


def usage_tokens_total(*, team: Team, kind: str | None = None) -> int:
    records = UsageRecord.objects.filter(team=team)
    if kind is not None:
        records = records.filter(kind=kind)
    totals = records.aggregate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    return int(totals["prompt"] or 0) + int(totals["completion"] or 0)


def usage_report(*, team: Team, start: date, end: date, group_by: str) -> dict[str, Any]:
    """Token sums, requests, cost and energy for ``[start, end]`` (whole days in the team's
    time zone), grouped by day, model, key (public prefix) or kind."""
    zone = ZoneInfo(team.time_zone)
    since = datetime.combine(start, time.min, tzinfo=zone)
    until = datetime.combine(end + timedelta(days=1), time.min, tzinfo=zone)
    records = UsageRecord.objects.filter(team=team, created_at__gte=since, created_at__lt=until)
    if group_by == "day":
        records = records.annotate(day=TruncDate("created_at", tzinfo=zone))
    sums = {name: Sum(name) for name in TOKEN_FIELDS}
    rows = (
        records.annotate(group=F(GROUPS[group_by]))
        .values("group")
        .annotate(**sums, requests=Count("pk"), cost=Sum("cost_usd"), energy=Sum("energy_wh"))
        .order_by("group")
    )
    data = [_row(row) for row in rows]
    total = _row(
        {
            "group": None,
            **records.aggregate(
                **sums, requests=Count("pk"), cost=Sum("cost_usd"), energy=Sum("energy_wh")
            ),
        }
    )
    return {"start": start, "end": end, "group_by": group_by, "data": data, "total": total}


def _row(row: dict[str, Any]) -> dict[str, Any]:
    tokens = {name: int(row.get(name) or 0) for name in TOKEN_FIELDS}
    group = row.get("group")
    return {
        "group": group.isoformat() if isinstance(group, date) else group,
        **tokens,
        # Subsets are never added: cached sits inside prompt, reasoning inside completion.
        "total_tokens": tokens["prompt_tokens"] + tokens["completion_tokens"],
        "requests": int(row.get("requests") or 0),
        "cost_usd": str((row.get("cost") or Decimal(0)).quantize(Decimal("1e-6"))),
        "energy_wh": round(float(row.get("energy") or 0.0), 4),
    }
