"""Reads of the token ledger."""

from __future__ import annotations

from django.db.models import Sum

from apps.accounts.models import Team
from apps.usage.models import UsageRecord


def usage_tokens_total(*, team: Team, kind: str | None = None) -> int:
    records = UsageRecord.objects.filter(team=team)
    if kind is not None:
        records = records.filter(kind=kind)
    totals = records.aggregate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    return int(totals["prompt"] or 0) + int(totals["completion"] or 0)
