"""Writes to the token ledger."""

from __future__ import annotations

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
