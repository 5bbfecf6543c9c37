"""Where an answer's events are kept for replay and resume: Redis when configured (a list
per message, with a TTL: :mod:`~apps.chat.event_store.redis`), else the database
(:mod:`~apps.chat.event_store.database`). Events are numbered 1, 2, 3… per message and
kept encrypted (:mod:`apps.core.crypto`): they hold the answer's text. The events
themselves are :mod:`apps.chat.services.types`.

Each append (a journal flush, every quarter second of an answer) is one record: a batch of
events, sealed once. Per event, a row or list item and an encryption would cost more than
the rest of the path a token takes; replay expands the batches again. The flushes of every
answer a process streams go out together (:meth:`EventStore.append_many`): one insert, or
one Redis round trip, a quarter second, however many streams are open. Each write
announces the messages it stored (:mod:`apps.chat.feed`), and a reader keeps an
:class:`EventCursor`: a replay reads only when woken, and only what is new."""

from __future__ import annotations

from django.conf import settings

from apps.chat.event_store.base import BATCH, EventCursor, Events, EventStore, events_after
from apps.chat.event_store.database import DatabaseEventStore
from apps.chat.event_store.redis import (
    EVENT_BUFFER_PREFIX,
    PIPELINE_SLICE,
    RedisEventStore,
    event_buffer_key,
    event_buffers_delete,
)

__all__ = [
    "BATCH",
    "EVENT_BUFFER_PREFIX",
    "PIPELINE_SLICE",
    "DatabaseEventStore",
    "EventCursor",
    "EventStore",
    "Events",
    "RedisEventStore",
    "event_buffer_key",
    "event_buffers_delete",
    "event_store",
    "events_after",
]


def event_store() -> EventStore:
    """A store for one answer or one replay; close it when done."""
    if settings.STREAM_BUFFER_REDIS_URL:
        return RedisEventStore(settings.STREAM_BUFFER_REDIS_URL, settings.STREAM_BUFFER_TTL)
    return DatabaseEventStore()
