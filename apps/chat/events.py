"""Where an answer's events are kept for replay and resume: Redis when configured (a list
per message, with a TTL), else the database. Events are numbered 1, 2, 3… per message and
kept encrypted (:mod:`apps.core.crypto`): they hold the answer's text.

Each append (a journal flush, every quarter second of an answer) is one record: a batch of
events, sealed once. Per event, a row or list item and an encryption would cost more than
the rest of the path a token takes; replay expands the batches again. The flushes of every
answer a process streams go out together (:meth:`EventStore.append_many`): one insert, or
one Redis round trip, a quarter second, however many streams are open. Each write
announces the messages it stored (:mod:`apps.chat.feed`), and a reader keeps an
:class:`EventCursor`: a replay reads only when woken, and only what is new."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from django.conf import settings

from apps.chat.feed import announcement, event_feed, feed_channel
from apps.chat.models import Message, MessageEvent
from apps.core.aio import db_call, redis_client
from apps.core.crypto import decrypt_bytes, encrypt_bytes
from apps.core.group_commit import budget_writer

Events = list[tuple[int, str, dict[str, Any]]]


class EventStore(Protocol):
    async def append(self, message_id: int, events: Events) -> None:
        """Store ``events`` (numbered, in order, not empty) as one record."""

    async def append_many(self, batches: Mapping[int, Events]) -> None:
        """:meth:`append` for several messages at once, in one write."""

    async def after(self, message_id: int, seq: int) -> Events:
        """The stored events numbered after ``seq``, in order."""

    async def read(self, cursor: EventCursor) -> Events:
        """The events stored since ``cursor`` last read (numbered past its ``seq``), in
        order; the cursor moves past them."""

    async def aclose(self) -> None: ...


@dataclass
class EventCursor:
    """Where a reader of one message's events stands, so that each read fetches only what
    is new: the last event it has (the database reads rows numbered past it) and how many
    records of the Redis list it has read (Redis reads the list from there)."""

    message_id: int
    seq: int = 0
    index: int = 0


BATCH = "batch"
"""The ``event`` of a database row holding a batch (``seq``: its last event's)."""


class DatabaseEventStore:
    async def append(self, message_id: int, events: Events) -> None:
        await self.append_many({message_id: events})

    async def append_many(self, batches: Mapping[int, Events]) -> None:
        await db_call(budget_writer.run)(_rows_insert, batches)
        # Committed: replays following these answers in this process read them now.
        event_feed.wake(batches)

    async def after(self, message_id: int, seq: int) -> Events:
        return await self.read(EventCursor(message_id, seq))

    async def read(self, cursor: EventCursor) -> Events:
        events = await db_call(self._after)(cursor.message_id, cursor.seq)
        if events:
            cursor.seq = events[-1][0]
        return events

    @staticmethod
    def _after(message_id: int, seq: int) -> Events:
        rows = MessageEvent.objects.filter(message_id=message_id, seq__gt=seq).order_by("seq")
        return _after(seq, ((row.seq, row.event, row.data) for row in rows))

    async def aclose(self) -> None:
        pass


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
        events = _after(cursor.seq, (tuple(_open(item)) for item in raw))  # type: ignore[misc]
        if events:
            cursor.seq = events[-1][0]
        return events

    async def aclose(self) -> None:
        pass  # the client is shared by every answer of this event loop


def _rows_insert(batches: Mapping[int, Events]) -> None:
    """One insert for every answer's batch, but for a message deleted meanwhile: its
    events go nowhere, and do not fail the other answers' with a dangling key."""
    alive = set(Message.objects.filter(pk__in=list(batches)).values_list("pk", flat=True))
    rows = [
        MessageEvent(message_id=message_id, seq=events[-1][0], event=BATCH, data=events)
        for message_id, events in batches.items()
        if message_id in alive
    ]
    MessageEvent.objects.bulk_create(rows, ignore_conflicts=True)


def _after(seq: int, records: Iterable[tuple[int, str, Any]]) -> Events:
    """The events after ``seq`` in stored records (ordered by their last event): batches
    (their last event's seq, ``BATCH``, the events) and single events (as stored before
    batches). An event stored twice (a flush retried after a write that did land) goes
    out once."""
    found: Events = []
    for last, name, data in records:
        batch = data if name == BATCH else [(last, name, data)]
        for s, e, d in batch:
            if s > seq:
                found.append((s, e, d))
                seq = s
    return found


def event_store() -> EventStore:
    """A store for one answer or one replay; close it when done."""
    if settings.STREAM_BUFFER_REDIS_URL:
        return RedisEventStore(settings.STREAM_BUFFER_REDIS_URL, settings.STREAM_BUFFER_TTL)
    return DatabaseEventStore()


EVENT_BUFFER_PREFIX = "ragtier:events:"


def event_buffer_key(message_id: int) -> str:
    return f"{EVENT_BUFFER_PREFIX}{message_id}"


PIPELINE_SLICE = 100
"""Messages per Redis pipeline when many answers' events are written together."""


def _seal_records(batches: Mapping[int, Events]) -> list[tuple[str, bytes]]:
    return [
        (event_buffer_key(message_id), _seal([events[-1][0], BATCH, events]))
        for message_id, events in batches.items()
    ]


def _seal(event: list[Any]) -> bytes:
    return encrypt_bytes(json.dumps(event, ensure_ascii=False).encode("utf-8"))


def _open(item: bytes) -> list[Any]:
    if item.startswith(b"["):  # written in clear before encryption; gone within the TTL
        return json.loads(item)  # type: ignore[no-any-return]
    return json.loads(decrypt_bytes(item))  # type: ignore[no-any-return]


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
