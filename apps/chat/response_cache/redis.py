"""The response cache in Redis: one encrypted value per (team, key) with its TTL, and per
team a sorted set of its keys by creation time, so a purge finds them without scanning the
keyspace."""

from __future__ import annotations

import time
from datetime import datetime
from typing import cast

import redis
from django.conf import settings

from apps.core.aio import redis_client
from apps.core.crypto import decrypt_bytes, encrypt_bytes


class RedisResponseCache:
    def __init__(self, url: str) -> None:
        self._redis = redis_client(url)

    async def get(self, *, team_id: int, key: str) -> str | None:
        sealed = await self._redis.get(_entry_key(team_id, key))
        return decrypt_bytes(sealed).decode("utf-8") if isinstance(sealed, bytes) else None

    async def put(self, *, team_id: int, key: str, payload: str, ttl: int) -> None:
        now = time.time()
        index = _index_key(team_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(_entry_key(team_id, key), encrypt_bytes(payload.encode("utf-8")), ex=ttl)
            pipe.zadd(index, {key: now})
            pipe.zremrangebyscore(index, "-inf", now - ttl)  # expired entries' members
            pipe.expire(index, ttl)
            await pipe.execute()


def redis_purge(url: str, *, team_id: int, older_than: datetime | None) -> int:
    """Drop ``team_id``'s entries written before ``older_than`` (all, when None); how many.
    Sync, on a connection of its own: deletes, the retention job, commands."""
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
            names = [_entry_key(team_id, key.decode("ascii")) for key in cast("list[bytes]", keys)]
            dropped += int(client.delete(*names))
            client.zrem(index, *keys)
    finally:
        client.close()
    return dropped


def _index_key(team_id: int) -> str:
    return f"{settings.RESPONSE_CACHE_KEY_PREFIX}{team_id}"


def _entry_key(team_id: int, key: str) -> str:
    return f"{settings.RESPONSE_CACHE_KEY_PREFIX}{team_id}:{key}"
