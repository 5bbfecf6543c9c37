"""Writes to the token ledger."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from apps.accounts.models import ApiKey, Team
from apps.usage import metrics
from apps.usage.models import UsageRecord
from apps.usage.values import Usage


def cost_of(*, model: str, prompt: int, cached: int, completion: int) -> Decimal:
    """USD from integer tokens: uncached input, cached input and output priced apart."""
    prices = settings.MODEL_PRICES.get(model, {})
    per_million = (
        (prompt - cached) * Decimal(str(prices.get("input", 0)))
        + cached * Decimal(str(prices.get("cached_input", prices.get("input", 0))))
        + completion * Decimal(str(prices.get("output", 0)))
    )
    return (per_million / 1_000_000).quantize(Decimal("1e-10"))


def energy_of(*, model: str, tokens: int) -> float:
    return tokens / 1000 * float(settings.MODEL_ENERGY_WH_PER_1K_TOKENS.get(model, 0.0))


def usage_record_embedding(
    *,
    team: Team,
    model: str,
    tokens: int,
    operation: str,
    object_id: str = "",
    api_key: ApiKey | None = None,
    user: AbstractBaseUser | None = None,
    status: str = UsageRecord.Status.OK,
) -> UsageRecord:
    """Charge embedding tokens (ingestion or query) to ``team``: they are input tokens."""
    metrics.TOKENS.labels("embedding", model, "input").inc(tokens)
    return UsageRecord.objects.create(
        team=team,
        api_key=api_key,
        user=user if user is not None and user.is_authenticated else None,
        kind=UsageRecord.Kind.EMBEDDING,
        model=model,
        operation=operation,
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
    user: AbstractBaseUser | None = None,
) -> UsageRecord:
    """One row per generation, whatever its outcome: tokens generated before an error or a
    cancel are billed like any others."""
    return UsageRecord.objects.create(
        team=team,
        api_key=api_key,
        user=user if user is not None and user.is_authenticated else None,
        kind=UsageRecord.Kind.CHAT,
        model=model,
        operation="answer",
        object_id=object_id,
        **usage.columns(),
        cost_usd=cost_of(
            model=model,
            prompt=usage.prompt_tokens,
            cached=usage.cached_tokens,
            completion=usage.completion_tokens,
        ),
        energy_wh=energy_of(model=model, tokens=usage.total_tokens),
        status=status,
        error_code=error_code,
    )
