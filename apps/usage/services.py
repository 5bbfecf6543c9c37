"""Writes to the token ledger, and to the limits (recorded in the audit log)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from dataclasses import asdict
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from apps.accounts.models import ApiKey, Team
from apps.accounts.selectors import KeyManager
from apps.core.audit import Actor, audit_record
from apps.core.exceptions import PermissionDenied
from apps.core.models import AuditEvent
from apps.usage import metrics
from apps.usage.limiters import LimiterUnavailable, limiter_keys_delete
from apps.usage.models import Limit, UsageRecord
from apps.usage.values import LimitValues, Usage
from inference import Price, price_parse
from inference.energy import ESTIMATED, Measured, energy_estimate


def price_of(model: str) -> Price:
    """``model``'s price in ``MODEL_PRICES`` (nothing listed: free)."""
    prices = settings.MODEL_PRICES.get(model, {})
    return Price(
        input=prices.get("input", 0.0),
        cached_input=prices.get("cached_input"),
        output=prices.get("output", 0.0),
    )


def alias_price(alias: str) -> Price:
    """What the ledger charges for ``alias``'s tokens: its registry entry's ``price``
    (``INFERENCE_MODELS``), else its row in ``MODEL_PRICES`` (see :func:`price_of`)."""
    fields = settings.INFERENCE_MODELS.get(alias)
    declared = price_parse(alias, fields.get("price")) if isinstance(fields, Mapping) else None
    return declared or price_of(alias)


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


def embedding_cost(*, model: str, tokens: int) -> Decimal:
    """What embedding ``tokens`` with ``model`` costs: input tokens, none cached."""
    return cost_of(model=model, prompt=tokens, cached=0, completion=0)


def usage_cost(*, model: str, usage: Usage, price: Price | None = None) -> Decimal:
    """What one generation's usage costs (:func:`cost_of`)."""
    return cost_of(
        model=model,
        prompt=usage.prompt_tokens,
        cached=usage.cached_tokens,
        completion=usage.completion_tokens,
        price=price,
    )


def energy_of(*, model: str, tokens: int, per_1k: float | None = None) -> float:
    """Wh estimated from the table: ``per_1k`` (a registry entry's), else ``model``'s in
    ``MODEL_ENERGY_WH_PER_1K_TOKENS``."""
    if per_1k is None:
        per_1k = float(settings.MODEL_ENERGY_WH_PER_1K_TOKENS.get(model, 0.0))
    return energy_estimate(tokens=tokens, wh_per_1k=per_1k)


def _energy_columns(
    *, model: str, tokens: int, per_1k: float | None, measured: Measured | None
) -> dict[str, float | str]:
    """What a counter measured (:mod:`apps.usage.energy`), else the table's estimate."""
    if measured is not None:
        return {"energy_wh": measured.wh, "energy_source": measured.source}
    wh = energy_of(model=model, tokens=tokens, per_1k=per_1k)
    return {"energy_wh": wh, "energy_source": ESTIMATED}


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
        cost_usd=embedding_cost(model=model, tokens=tokens),
        **_energy_columns(model=model, tokens=tokens, per_1k=None, measured=None),
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
    route_reason: str = "",
    upstream: str = "",
    price: Price | None = None,
    energy: float | None = None,
    measured: Measured | None = None,
    detached_unread_tokens: int = 0,
    tag: str = "",
    operation: str = "answer",
) -> UsageRecord:
    """One row per generation, whatever its outcome: tokens generated before an error or a
    cancel are billed like any others (``detached_unread_tokens`` of them made while the
    client was gone, and never read). ``model`` is the alias that served, priced at
    ``price`` and ``energy`` (Wh per 1000 tokens) when its registry entry has them, its
    energy ``measured`` when a counter measured it (else estimated from ``energy``);
    ``requested_model`` the alias asked for, ``route_reason`` why ``model`` served it (a
    short code); ``upstream`` the server (never shown to callers); ``operation`` what
    generated: an ``answer``, or a history ``summary``."""
    return UsageRecord.objects.create(
        team=team,
        api_key=api_key,
        user=user if user is not None and user.is_authenticated else None,
        kind=UsageRecord.Kind.CHAT,
        model=model,
        requested_model=requested_model,
        route_reason=route_reason,
        upstream=upstream,
        operation=operation,
        object_id=object_id,
        tag=tag,
        **usage.columns(),
        cost_usd=usage_cost(model=model, usage=usage, price=price),
        **_energy_columns(model=model, tokens=usage.total_tokens, per_1k=energy, measured=measured),
        status=status,
        error_code=error_code,
        detached_unread_tokens=detached_unread_tokens,
        context_window=usage.context_window,
        dropped_passages=usage.dropped_passages,
        dropped_turns=usage.dropped_turns,
        summarized_turns=usage.summarized_turns,
        dropped_tokens=usage.dropped_tokens,
    )


def _limit_values(limit: Limit) -> dict[str, Any]:
    requests = {
        "requests_per_second": limit.requests_per_second,
        "request_burst": limit.request_burst,
    }
    return {**LimitValues.of(limit).recorded(), **requests}


def _limit_target(limit: Limit) -> str:
    if limit.api_key:
        return f"key {limit.api_key.prefix}"
    return f"team {limit.team.name}" + (f" tag {limit.tag}" if limit.tag else "")


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
    limit_id = limit.pk
    limit.delete()
    transaction.on_commit(functools.partial(_limiter_forget, limit_id))


def _limiter_forget(limit_id: int) -> None:
    """A deleted limit's Redis state (its bucket, slots and counters) goes too."""
    with contextlib.suppress(LimiterUnavailable):  # else they expire on their own
        limiter_keys_delete(limit_ids=[limit_id])


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
