"""A team-scoped, encrypted store of cached answers with a TTL: Redis when configured
(``RESPONSE_CACHE_REDIS_URL``), else the database.

It knows nothing of answers: it keeps a text payload per (team, key), encrypted at rest
(:mod:`apps.core.crypto`, as the answer journal is), for ``RESPONSE_CACHE_TTL`` seconds,
never longer than the team's ``retention_days``. Entries are purged with the team's data:
:func:`response_cache_purge` on deletes and by the retention job, so no cached answer
stays readable past what the team keeps. In Redis each team has a sorted set of its keys
by creation time, so a purge finds them without scanning the keyspace.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Protocol

import redis
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.accounts.models import Team
from apps.core.aio import db_call, redis_client
from apps.core.crypto import decrypt_bytes, encrypt_bytes
from apps.core.models import ResponseCacheEntry

__all__ = [
    "ResponseCache",
    "response_cache",
    "response_cache_expire",
    "response_cache_purge",
    "response_cache_ttl",
]


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


class RedisResponseCache:
    def __init__(self, url: str) -> None:
        self._redis = redis_client(url)

    async def get(self, *, team_id: int, key: str) -> str | None:
        sealed = await self._redis.get(_entry_key(team_id, key))
        return decrypt_bytes(sealed).decode("utf-8") if sealed is not None else None

    async def put(self, *, team_id: int, key: str, payload: str, ttl: int) -> None:
        now = time.time()
        index = _index_key(team_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(_entry_key(team_id, key), encrypt_bytes(payload.encode("utf-8")), ex=ttl)
            pipe.zadd(index, {key: now})
            pipe.zremrangebyscore(index, "-inf", now - ttl)  # expired entries' members
            pipe.expire(index, ttl)
            await pipe.execute()


def response_cache() -> ResponseCache:
    url = settings.RESPONSE_CACHE_REDIS_URL
    return RedisResponseCache(url) if url else DatabaseResponseCache()


def response_cache_purge(*, team_id: int, older_than: datetime | None = None) -> int:
    """Drop ``team_id``'s entries written before ``older_than`` (all, when None) and any
    expired ones, from the database and from Redis; how many were dropped. Sync: deletes,
    the retention job, commands."""
    entries = ResponseCacheEntry.objects.filter(team_id=team_id)
    if older_than is not None:
        entries = entries.filter(Q(created_at__lt=older_than) | Q(expires_at__lte=timezone.now()))
    dropped, _ = entries.delete()
    url = settings.RESPONSE_CACHE_REDIS_URL
    if url:
        dropped += _redis_purge(url, team_id=team_id, older_than=older_than)
    return dropped


def response_cache_expire() -> int:
    """Delete the database's expired entries, every team's (Redis expires its own); they
    are never read, this only reclaims their rows. Run with the hourly retention job."""
    dropped, _ = ResponseCacheEntry.objects.filter(expires_at__lte=timezone.now()).delete()
    return int(dropped)


def _redis_purge(url: str, *, team_id: int, older_than: datetime | None) -> int:
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
        socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
    )
    index = _index_key(team_id)
    until = "+inf" if older_than is None else older_than.timestamp()
    dropped = 0
    try:
        while keys := client.zrangebyscore(index, "-inf", until, start=0, num=500):
            names = [_entry_key(team_id, key.decode("ascii")) for key in keys]
            dropped += int(client.delete(*names))
            client.zrem(index, *keys)
    finally:
        client.close()
    return dropped


def _index_key(team_id: int) -> str:
    return f"{settings.RESPONSE_CACHE_KEY_PREFIX}{team_id}"


def _entry_key(team_id: int, key: str) -> str:
    return f"{settings.RESPONSE_CACHE_KEY_PREFIX}{team_id}:{key}"
