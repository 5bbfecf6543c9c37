"""The response cache in the database: one encrypted row per (team, key), with its expiry."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from apps.core.aio import db_call
from apps.core.models import ResponseCacheEntry


class DatabaseResponseCache:
    async def get(self, *, team_id: int, key: str) -> str | None:
        return await db_call(self._get)(team_id, key)

    @staticmethod
    def _get(team_id: int, key: str) -> str | None:
        entry = (
            ResponseCacheEntry.objects.filter(
                team_id=team_id, key=key, expires_at__gt=timezone.now()
            )
            .only("payload")
            .first()
        )
        return entry.payload if entry is not None else None

    async def put(self, *, team_id: int, key: str, payload: str, ttl: int) -> None:
        await db_call(self._put)(team_id=team_id, key=key, payload=payload, ttl=ttl)

    @staticmethod
    def _put(*, team_id: int, key: str, payload: str, ttl: int) -> None:
        now = timezone.now()
        ResponseCacheEntry.objects.update_or_create(
            team_id=team_id,
            key=key,
            defaults={"payload": payload, "expires_at": now + timedelta(seconds=ttl)},
        )


def database_purge(*, team_id: int, older_than: datetime | None) -> int:
    """Drop ``team_id``'s rows written before ``older_than`` (all, when None) and its
    expired ones; how many."""
    entries = ResponseCacheEntry.objects.filter(team_id=team_id)
    if older_than is not None:
        entries = entries.filter(Q(created_at__lt=older_than) | Q(expires_at__lte=timezone.now()))
    dropped, _ = entries.delete()
    return int(dropped)


def database_expire() -> int:
    """Delete every team's expired rows; they are never read, this only reclaims them."""
    dropped, _ = ResponseCacheEntry.objects.filter(expires_at__lte=timezone.now()).delete()
    return int(dropped)
