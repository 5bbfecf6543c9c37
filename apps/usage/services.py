"""Writes to the token ledger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from apps.accounts.models import ApiKey, Team
from apps.usage.models import UsageRecord


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
    return UsageRecord.objects.create(
        team=team,
        api_key=api_key,
        user=user if user is not None and user.is_authenticated else None,
        kind=UsageRecord.Kind.EMBEDDING,
        model=model,
        operation=operation,
        object_id=object_id,
        prompt_tokens=tokens,
        status=status,
    )


def usage_record_chat(
    *,
    team: Team,
    model: str,
    usage: Mapping[str, Any],
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
        prompt_tokens=usage["prompt_tokens"],
        cached_tokens=usage["cached_tokens"],
        completion_tokens=usage["completion_tokens"],
        reasoning_tokens=usage["reasoning_tokens"],
        ttft_ms=usage["ttft_ms"],
        duration_ms=usage["duration_ms"],
        tokens_per_second=usage["tokens_per_second"],
        status=status,
        error_code=error_code,
    )
