"""What every store of the response cache offers, and how long an entry may live."""

from __future__ import annotations

from typing import Protocol

from django.conf import settings

from apps.accounts.models import Team


class ResponseCache(Protocol):
    async def get(self, *, team_id: int, key: str) -> str | None: ...

    async def put(self, *, team_id: int, key: str, payload: str, ttl: int) -> None: ...


def response_cache_ttl(*, team: Team) -> int:
    """Seconds an entry of ``team`` lives: ``RESPONSE_CACHE_TTL`` (0: the cache is off),
    capped by the team's retention, so that expiry alone already honours it."""
    ttl = max(0, int(settings.RESPONSE_CACHE_TTL))
    if team.retention_days is not None:
        ttl = min(ttl, team.retention_days * 86400)
    return ttl
