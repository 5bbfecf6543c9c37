"""Reads of the token ledger."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db.models import Aggregate, Count, F, Q, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from apps.accounts.models import ApiKey, Team
from apps.accounts.selectors import KeyManager, api_key_list
from apps.usage.limiters import (
    TOKENS,
    USD,
    LimiterUnavailable,
    QuotaKey,
    RedisLimiter,
    buckets_and_slots,
    limiter,
)
from apps.usage.limits import limit_periods, limits_of
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord
from apps.usage.periods import period_bounds
from apps.usage.services import cost_of
from apps.usage.values import NANOS_PER_USD, LimitValues
from inference import Price

GROUPS = {
    "day": "day",
    "model": "model",
    "key": "api_key__prefix",
    "kind": "kind",
    "tag": "tag",
}
TOKEN_FIELDS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
ANSWERS = Q(kind=UsageRecord.Kind.CHAT, operation="answer")
"""The rows a router chose a model for (not embeddings, nor summaries the small alias
always makes)."""


def usage_tokens_total(*, team: Team, kind: str | None = None) -> int:
    records = UsageRecord.objects.filter(team=team)
    if kind is not None:
        records = records.filter(kind=kind)
    totals = records.aggregate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    return int(totals["prompt"] or 0) + int(totals["completion"] or 0)


def usage_report(
    *,
    team: Team,
    start: date,
    end: date,
    group_by: str,
    api_keys: QuerySet[ApiKey] | None = None,
    counterfactual: Price | None = None,
) -> dict[str, Any]:
    """Token sums, requests, cost and energy for ``[start, end]`` (whole days in the team's
    time zone), grouped by day, model, key (public prefix), kind or tag; with ``api_keys``,
    of those keys only (rows and total). With ``counterfactual``, each row also has
    ``counterfactual_usd``: its cost had every answer been priced at that price (the same
    tokens; its other rows as they cost)."""
    zone = ZoneInfo(team.time_zone)
    since = datetime.combine(start, time.min, tzinfo=zone)
    until = datetime.combine(end + timedelta(days=1), time.min, tzinfo=zone)
    records = UsageRecord.objects.filter(team=team, created_at__gte=since, created_at__lt=until)
    if api_keys is not None:
        records = records.filter(api_key__in=api_keys)
    if group_by == "day":
        records = records.annotate(day=TruncDate("created_at", tzinfo=zone))
    sums = _sums(counterfactual is not None)
    rows = (
        records.annotate(group=F(GROUPS[group_by]))
        .values("group")
        .annotate(**sums)
        .order_by("group")
    )
    data = [_row(row, counterfactual) for row in rows]
    total = _row({"group": None, **records.aggregate(**sums)}, counterfactual)
    return {"start": start, "end": end, "group_by": group_by, "data": data, "total": total}


def usage_keys_shown(*, manager: KeyManager, group_by: str) -> QuerySet[ApiKey] | None:
    """The keys whose usage a report grouped by ``group_by`` may show the caller, None:
    all. Grouped by key, a report names each key's prefix, so a member sees only the keys
    they manage (``api_key_list``); owners and admins, and other groupings, see the team's."""
    if group_by != "key" or manager.manages_team:
        return None
    return api_key_list(manager=manager)


def _sums(counterfactual: bool) -> dict[str, Aggregate]:
    sums: dict[str, Aggregate] = {}
    if counterfactual:  # first: a later sum named like a field shadows the field
        sums |= {f"answer_{name}": Sum(name, filter=ANSWERS) for name in TOKEN_FIELDS}
        sums["other_cost"] = Sum("cost_usd", filter=~ANSWERS)
    sums |= {name: Sum(name) for name in TOKEN_FIELDS}
    sums |= {"requests": Count("pk"), "cost": Sum("cost_usd"), "energy": Sum("energy_wh")}
    return sums


def _counterfactual_usd(row: Mapping[str, Any], price: Price) -> str:
    """The answers' tokens at ``price``, plus what the other rows cost."""
    answers = cost_of(
        model="",
        prompt=int(row.get("answer_prompt_tokens") or 0),
        cached=int(row.get("answer_cached_tokens") or 0),
        completion=int(row.get("answer_completion_tokens") or 0),
        price=price,
    )
    return _usd(answers + (row.get("other_cost") or Decimal(0)))


def _usd(amount: Decimal) -> str:
    return str(amount.quantize(Decimal("1e-6")))


def _row(row: Mapping[str, Any], counterfactual: Price | None = None) -> dict[str, Any]:
    tokens = {name: int(row.get(name) or 0) for name in TOKEN_FIELDS}
    group = row.get("group")
    extra = (
        {}
        if counterfactual is None
        else {"counterfactual_usd": _counterfactual_usd(row, counterfactual)}
    )
    return {
        "group": group.isoformat() if isinstance(group, date) else group,
        **tokens,
        # Subsets are never added: cached sits inside prompt, reasoning inside completion.
        "total_tokens": tokens["prompt_tokens"] + tokens["completion_tokens"],
        "requests": int(row.get("requests") or 0),
        "cost_usd": _usd(row.get("cost") or Decimal(0)),
        "energy_wh": round(float(row.get("energy") or 0.0), 4),
        **extra,
    }


def quota_used(*, key: QuotaKey, now: datetime | None = None) -> int:
    """What a quota counts against its limit: settled plus held, as the store that
    enforces it sees it (Redis when configured and it has the quota, else the database).
    Raises :class:`LimiterUnavailable` if Redis is configured but unreachable."""
    now = now or timezone.now()
    store = limiter()
    if isinstance(store, RedisLimiter):
        used = store.quota_used(key, now)
        if used is not None:
            return used
    counter = QuotaCounter.objects.filter(
        limit_id=key.limit_id, period=key.period, starts_on=key.starts_on, unit=key.unit
    ).first()
    return counter.used if counter is not None else 0


def quota_report(
    *, team: Team, api_key: ApiKey | None, now: datetime | None = None
) -> dict[str, Any]:
    """The limits that apply to the caller and what remains of each, without changing any:
    the team's, the key's, and the team's limits of its purpose tags (each binding the
    requests under its tag)."""
    now = now or timezone.now()
    zone = ZoneInfo(team.time_zone)
    store = limiter()
    report: list[dict[str, Any]] = []
    tagged = Limit.objects.filter(team=team).exclude(tag="")
    for limit in (limits_of(team=team, api_key=api_key) | tagged).select_related("api_key"):
        scope = f"key {limit.api_key.prefix}" if limit.api_key else "team"
        scope += f" tag {limit.tag}" if limit.tag else ""
        entry: dict[str, Any] = {
            "scope": scope,
            "bucket": None,
            "day": None,
            "month": None,
            "day_usd": None,
            "month_usd": None,
            "max_concurrent_streams": limit.max_concurrent_streams,
            "max_tokens": limit.max_tokens,
        }
        bucket, _ = buckets_and_slots(limit)
        if bucket is not None:
            try:
                available: int | None = store.available(bucket, now)
            except LimiterUnavailable:
                available = None
            entry["bucket"] = {
                "capacity": bucket.capacity,
                "tokens_per_minute": bucket.rate,
                "available": available,
            }
        for period, unit, quota in limit_periods(limit):
            starts_on, resets_at = period_bounds(period, now, zone)
            used = _quota_used_now(QuotaKey(limit.pk, period, starts_on, unit), now)
            shown = _dollars if unit == USD else int
            entry[period if unit == TOKENS else f"{period}_usd"] = {
                "limit": shown(quota),
                "used": shown(used),
                "remaining": shown(max(0, quota - used)),
                "resets_at": resets_at.isoformat(),
            }
        report.append(entry)
    return {"limits": report, "unlimited": not report}


def _quota_used_now(key: QuotaKey, now: datetime) -> int:
    try:
        return quota_used(key=key, now=now)
    except LimiterUnavailable:  # what settled, as the database records it
        counter = QuotaCounter.objects.filter(
            limit_id=key.limit_id, period=key.period, starts_on=key.starts_on, unit=key.unit
        ).first()
        return counter.used if counter else 0


def _dollars(nanos: int) -> str:
    return str((Decimal(nanos) / NANOS_PER_USD).quantize(Decimal("1e-6")))


def reservations_open() -> dict[str, tuple[int, int]]:
    """{kind: (open reservations, tokens they hold)}, every kind present."""
    rows = (
        Reservation.objects.filter(settled_at__isnull=True)
        .values("kind")
        .annotate(number=Count("pk"), held=Sum("tokens"))
    )
    found = {row["kind"]: (int(row["number"]), int(row["held"] or 0)) for row in rows}
    return {kind: found.get(kind, (0, 0)) for kind in UsageRecord.Kind.values}


def usage_daily_by_kind(*, team: Team, start: date, end: date) -> list[dict[str, Any]]:
    """Tokens (prompt + completion) per day of the team's time zone and kind, for every day
    of ``[start, end]`` and every kind, zeros included, oldest first."""
    zone = ZoneInfo(team.time_zone)
    since = datetime.combine(start, time.min, tzinfo=zone)
    until = datetime.combine(end + timedelta(days=1), time.min, tzinfo=zone)
    rows = (
        UsageRecord.objects.filter(team=team, created_at__gte=since, created_at__lt=until)
        .annotate(day=TruncDate("created_at", tzinfo=zone))
        .values("day", "kind")
        .annotate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )
    found = {
        (row["day"], row["kind"]): int(row["prompt"] or 0) + int(row["completion"] or 0)
        for row in rows
    }
    days = [start + timedelta(days=n) for n in range((end - start).days + 1)]
    return [
        {
            "day": day,
            "tokens": {kind: found.get((day, kind), 0) for kind in UsageRecord.Kind.values},
        }
        for day in days
    ]


def key_limit_values(*, api_key: ApiKey) -> LimitValues:
    """The key's own limits (all None when it has none); the team's apply on top."""
    limit = Limit.objects.filter(api_key=api_key).first()
    return LimitValues.of(limit) if limit is not None else LimitValues()
