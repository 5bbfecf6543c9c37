"""The store the settings choose: Redis when ``RESPONSE_CACHE_REDIS_URL`` is set, else the
database; and the purges that clear both."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from apps.chat.response_cache.base import ResponseCache
from apps.chat.response_cache.database import (
    DatabaseResponseCache,
    database_expire,
    database_purge,
)
from apps.chat.response_cache.redis import RedisResponseCache, redis_purge


def response_cache() -> ResponseCache:
    url = settings.RESPONSE_CACHE_REDIS_URL
    return RedisResponseCache(url) if url else DatabaseResponseCache()


def response_cache_purge(*, team_id: int, older_than: datetime | None = None) -> int:
    """Drop ``team_id``'s entries written before ``older_than`` (all, when None) and any
    expired ones, from the database and from Redis; how many were dropped. Sync: deletes,
    the retention job, commands."""
    dropped = database_purge(team_id=team_id, older_than=older_than)
    url = settings.RESPONSE_CACHE_REDIS_URL
    if url:
        dropped += redis_purge(url, team_id=team_id, older_than=older_than)
    return dropped


def response_cache_expire() -> int:
    """Delete the database's expired entries, every team's (Redis expires its own). Run
    with the hourly retention job."""
    return database_expire()
