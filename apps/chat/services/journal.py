"""An answer's event journal, kept for replay and resume (``Last-Event-ID``).

:class:`Journal` numbers an answer's events as they go out; what it keeps is written to the
event store (:mod:`apps.chat.event_store`) by the process's one :class:`JournalWriter`,
every ``FLUSH_EVERY_SECONDS``, for every answer at once; an answer that ends flushes its own
last events. The journal serves replay only: a store that fails never fails the answer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TypeVar

from django.db import DatabaseError
from redis.exceptions import RedisError

from apps.chat.event_store import Events, event_store
from apps.chat.services.types import AnswerEvent
from apps.core.aio import loop_cached

logger = logging.getLogger(__name__)

FLUSH_EVERY_SECONDS = 0.25
E = TypeVar("E", bound=AnswerEvent)


class Journal:
    """Numbers events and has them written to the event store in small batches (or only
    numbers them, for an answer that is not to be stored: ``keep=False``)."""

    def __init__(self, *, keep: bool = True) -> None:
        self.message_id = 0
        self.seq = 0
        self.pending: list[AnswerEvent] = []
        self.writing: asyncio.Future[None] | None = None
        """The group write holding this journal's earlier events, while it is under way."""
        self.writer = journal_writer() if keep else None
        self.store = event_store()
        self.closed = False

    def add(self, event: E) -> E:
        self.seq += 1
        numbered = replace(event, id=self.seq)
        if self.writer is not None:
            self.pending.append(numbered)  # rendered at flush, off the per-token path
            self.writer.mark(self)
        return numbered

    def take(self) -> Events:
        pending, self.pending = self.pending, []
        return [(e.id, e.name, e.data()) for e in pending]

    async def flush(self) -> None:
        """Write what is pending, now, after any write holding earlier events (a Redis
        list keeps the order of writes, and a reader skips what is numbered below what it
        holds: two writes of one journal at once could land out of order). The journal
        serves replay only: a store that fails (Redis or the database busy or down) never
        fails the answer itself; the events stay pending and the next flush tries again."""
        while self.writing is not None:  # one write of a journal at a time: in order
            await asyncio.shield(self.writing)
        if not (self.pending and self.message_id):
            return
        pending = self.pending
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.writing = written  # the group writer leaves this journal alone meanwhile
        try:
            await self.store.append(self.message_id, self.take())
        except (RedisError, DatabaseError, TimeoutError) as exc:
            logger.warning("message %s: events not journalled yet: %r", self.message_id, exc)
            self.pending = pending + self.pending
        finally:
            self.writing = None
            written.set_result(None)

    async def close(self) -> None:
        await self.flush()
        if not self.closed:
            self.closed = True
            if self.writer is not None:
                self.writer.dirty.discard(self)
            await self.store.aclose()


class JournalWriter:
    """The pending events of every answer this process streams, written together every
    ``FLUSH_EVERY_SECONDS``: one insert (or one Redis round trip) for all of them. One
    write per answer would be a thousand a second for a thousand streams at a token a
    second, and on SQLite, a thousand commits."""

    def __init__(self) -> None:
        self.dirty: set[Journal] = set()
        self.task: asyncio.Task[None] | None = None
        self.store = event_store()

    def mark(self, journal: Journal) -> None:
        self.dirty.add(journal)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self.dirty:
            await asyncio.sleep(FLUSH_EVERY_SECONDS)
            await self.write()

    async def write(self) -> None:
        ready = [j for j in self.dirty if j.message_id and j.pending and j.writing is None]
        self.dirty.difference_update(j for j in list(self.dirty) if not j.pending)
        if not ready:
            return
        self.dirty.difference_update(ready)
        pending = {journal: journal.pending for journal in ready}
        batches = {journal.message_id: journal.take() for journal in ready}
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for journal in ready:
            journal.writing = written
        try:
            await self.store.append_many(batches)
        except Exception as exc:  # the events stay pending; the next round tries again
            logger.warning("%d answers: events not journalled yet: %r", len(ready), exc)
            for journal, events in pending.items():
                journal.pending = events + journal.pending
                self.dirty.add(journal)
        finally:
            for journal in ready:
                journal.writing = None
            written.set_result(None)


@loop_cached
def journal_writer() -> JournalWriter:
    return JournalWriter()
