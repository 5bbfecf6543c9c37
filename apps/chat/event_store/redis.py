"""An answer's events in Redis: a list per message, with a TTL, each item one journal
flush sealed once (:mod:`apps.core.crypto`). Each write announces the messages it stored
on the feed's channel (:mod:`apps.chat.feed`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, cast

import redis
from django.conf import settings

from apps.chat.event_store.base import BATCH, EventCursor, Events, events_after
from apps.chat.feed import announcement, feed_channel
from apps.core.aio import db_call, redis_client
from apps.core.crypto import decrypt_bytes, encrypt_bytes

EVENT_BUFFER_PREFIX = "ragtier:events:"


def event_buffer_key(message_id: int) -> str:
    return f"{EVENT_BUFFER_PREFIX}{message_id}"


PIPELINE_SLICE = 100
"""Messages per Redis pipeline when many answers' events are written together."""


class RedisEventStore:
    def __init__(self, url: str, ttl: int) -> None:
        self._redis = redis_client(url)
        self._ttl = ttl
        self._channel = feed_channel(url)

    @staticmethod
    def key(message_id: int) -> str:
        return event_buffer_key(message_id)

    async def append(self, message_id: int, events: Events) -> None:
        await self.append_many({message_id: events})

    async def append_many(self, batches: Mapping[int, Events]) -> None:
        # Sealing a thousand batches takes tens of milliseconds: on the pool, not on the
        # event loop every open stream shares; and the writes go in slices, so that no one
        # pipeline's packing and replies hold the loop for long either.
        # Each slice announces its messages after storing them (apps.chat.feed): the
        # replays following them, in any process, wake and read what is new.
        records = await db_call(_seal_records)(batches)
        ids = list(batches)
        for start in range(0, len(records), PIPELINE_SLICE):
            async with self._redis.pipeline(transaction=False) as pipe:
                for key, record in records[start : start + PIPELINE_SLICE]:
                    pipe.rpush(key, record)
                    pipe.expire(key, self._ttl)
                pipe.publish(self._channel, announcement(ids[start : start + PIPELINE_SLICE]))
                await pipe.execute()

    async def after(self, message_id: int, seq: int) -> Events:
        return await self.read(EventCursor(message_id, seq))

    async def read(self, cursor: EventCursor) -> Events:
        # Only the records past those already read: a long answer's list is not fetched
        # and decrypted whole on every wake-up.
        raw = await self._redis.lrange(self.key(cursor.message_id), cursor.index, -1)
        cursor.index += len(raw)
        events = events_after(cursor.seq, (tuple(_open(item)) for item in raw))
        if events:
            cursor.seq = events[-1][0]
        return events

    async def aclose(self) -> None:
        pass  # the client is shared by every answer of this event loop


def _seal_records(batches: Mapping[int, Events]) -> list[tuple[str, bytes]]:
    return [
        (event_buffer_key(message_id), _seal([events[-1][0], BATCH, events]))
        for message_id, events in batches.items()
    ]


def _seal(event: list[Any]) -> bytes:
    return encrypt_bytes(json.dumps(event, ensure_ascii=False).encode("utf-8"))


def _open(item: bytes | str) -> list[Any]:
    # bytes: the client does not decode replies (redis-py types every reply bytes or str)
    raw = cast(bytes, item)
    if raw.startswith(b"["):  # written in clear before encryption; gone within the TTL
        record: list[Any] = json.loads(raw)
    else:
        record = json.loads(decrypt_bytes(raw))
    return record


def event_buffers_delete(*, message_ids: Iterable[int]) -> int:
    """Drop the Redis copies of these messages' events (sync: deletes, purges, commands).
    The database copies go with their message rows."""
    url = settings.STREAM_BUFFER_REDIS_URL
    keys = [event_buffer_key(message_id) for message_id in message_ids]
    if not url or not keys:
        return 0
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
        socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
    )
    deleted = 0
    try:
        for start in range(0, len(keys), 500):
            deleted += int(client.delete(*keys[start : start + 500]))
    finally:
        client.close()
    return deleted
