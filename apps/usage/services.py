"""Writes to the token ledger, and to the limits (recorded in the audit log)."""

from __future__ import annotations

from dataclasses import asdict
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from apps.accounts.models import ApiKey, Team
from apps.accounts.selectors import KeyManager
from apps.core.audit import Actor, audit_record
from apps.core.exceptions import PermissionDenied
from apps.core.models import AuditEvent
from apps.usage import metrics
from apps.usage.models import Limit, UsageRecord
from apps.usage.values import LimitValues, Usage
from inference import Price


def price_of(model: str) -> Price:
    """``model``'s price in ``MODEL_PRICES`` (nothing listed: free)."""
    prices = settings.MODEL_PRICES.get(model, {})
    return Price(
        input=prices.get("input", 0.0),
        cached_input=prices.get("cached_input"),
        output=prices.get("output", 0.0),
    )


def cost_of(
    *, model: str, prompt: int, cached: int, completion: int, price: Price | None = None
) -> Decimal:
    """USD from integer tokens: uncached input, cached input and output priced apart, at
    ``price`` (a registry entry's), else at ``model``'s in ``MODEL_PRICES``."""
    price = price or price_of(model)
    per_million = (
        (prompt - cached) * Decimal(str(price.input))
        + cached * Decimal(str(price.cached))
        + completion * Decimal(str(price.output))
    )
    return (per_million / 1_000_000).quantize(Decimal("1e-10"))


def energy_of(*, model: str, tokens: int, per_1k: float | None = None) -> float:
    if per_1k is None:
        per_1k = float(settings.MODEL_ENERGY_WH_PER_1K_TOKENS.get(model, 0.0))
    return tokens / 1000 * per_1k


def usage_record_embedding(
    *,
    team: Team,
    model: str,
    tokens: int,
    operation: str,
    object_id: str = "",
    api_key: ApiKey | None = None,
    user: User | None = None,
    status: str = UsageRecord.Status.OK,
    tag: str = "",
) -> UsageRecord:
    """Charge embedding tokens (ingestion or query) to ``team``: they are input tokens;
    ``tag``, what they were for (:mod:`apps.core.tags`)."""
    metrics.TOKENS.labels("embedding", model, "input").inc(tokens)
    return UsageRecord.objects.create(
        team=team,
        api_key=api_key,
        user=user if user is not None and user.is_authenticated else None,
        kind=UsageRecord.Kind.EMBEDDING,
        model=model,
        operation=operation,
        tag=tag,
        object_id=object_id,
        prompt_tokens=tokens,
        cost_usd=cost_of(model=model, prompt=tokens, cached=0, completion=0),
        energy_wh=energy_of(model=model, tokens=tokens),
        status=status,
    )


def usage_record_chat(
    *,
    team: Team,
    model: str,
    usage: Usage,
    status: str,
    object_id: str,
    error_code: str = "",
    api_key: ApiKey | None = None,
    user: User | None = None,
    requested_model: str = "",
    upstream: str = "",
    price: Price | None = None,
    energy: float | None = None,
    detached_unread_tokens: int = 0,
    tag: str = "",
    operation: str = "answer",
) -> UsageRecord:
    """One row per generation, whatever its outcome: tokens generated before an error or a
    cancel are billed like any others (``detached_unread_tokens`` of them made while the
    client was gone, and never read). ``model`` is the alias that served, priced at
    ``price`` and ``energy`` (Wh per 1000 tokens) when its registry entry has them;
    ``requested_model`` the alias asked for; ``upstream`` the server (never shown to
    callers); ``operation`` what generated: an ``answer``, or a history ``summary``."""
    return UsageRecord.objects.create(
        team=team,
        api_key=api_key,
        user=user if user is not None and user.is_authenticated else None,
        kind=UsageRecord.Kind.CHAT,
        model=model,
        requested_model=requested_model,
        upstream=upstream,
        operation=operation,
        object_id=object_id,
        tag=tag,
        **usage.columns(),
        cost_usd=cost_of(
            model=model,
            prompt=usage.prompt_tokens,
            cached=usage.cached_tokens,
            completion=usage.completion_tokens,
            price=price,
        ),
        energy_wh=energy_of(model=model, tokens=usage.total_tokens, per_1k=energy),
        status=status,
        error_code=error_code,
        detached_unread_tokens=detached_unread_tokens,
        context_window=usage.context_window,
        dropped_passages=usage.dropped_passages,
        dropped_turns=usage.dropped_turns,
        summarized_turns=usage.summarized_turns,
        dropped_tokens=usage.dropped_tokens,
    )


def _limit_values(limit: Limit) -> dict[str, int | None]:
    requests = {
        "requests_per_second": limit.requests_per_second,
        "request_burst": limit.request_burst,
    }
    return {**asdict(LimitValues.of(limit)), **requests}


def _limit_target(limit: Limit) -> str:
    return f"key {limit.api_key.prefix}" if limit.api_key else f"team {limit.team.name}"


@transaction.atomic
def limit_save(*, limit: Limit, actor: Actor) -> Limit:
    """Save a team's or key's limits as set on ``limit``, recording the change with the
    values before and after (the admin and ``setlimits`` both save through here)."""
    created = limit.pk is None
    before = {} if created else _limit_values(Limit.objects.get(pk=limit.pk))
    limit.save()
    after = _limit_values(limit)
    action = AuditEvent.Action.LIMIT_CREATED if created else AuditEvent.Action.LIMIT_CHANGED
    if created or before != after:
        audit_record(
            action=action,
            actor=actor,
            team=limit.team,
            target=_limit_target(limit),
            detail={"before": before, "after": after},
        )
    return limit


@transaction.atomic
def limit_delete(*, limit: Limit, actor: Actor) -> None:
    """Remove a team's or key's limits (unlimited from now on), recording what they were."""
    audit_record(
        action=AuditEvent.Action.LIMIT_DELETED,
        actor=actor,
        team=limit.team,
        target=_limit_target(limit),
        detail={"before": _limit_values(limit)},
    )
    limit.delete()


def key_limits_set(*, manager: KeyManager, api_key: ApiKey, values: LimitValues) -> Limit:
    """Replace the limits of one of the team's keys (each one left out: unlimited).

    Team owners and admins only. A key's limits apply on top of the team's, so they can
    only narrow what the team may spend; the team's own limits stay with staff (the admin,
    ``setlimits``).
    """
    if not manager.manages_team:
        raise PermissionDenied(
            "Only the team's owners and admins set key limits.", code="role_forbidden"
        )
    limit = Limit.objects.filter(api_key=api_key).first() or Limit(
        team=api_key.team, api_key=api_key
    )
    for name, value in asdict(values).items():
        setattr(limit, name, value)
    return limit_save(limit=limit, actor=manager.caller.actor)
