"""An answer's events as rows of :class:`~apps.chat.models.MessageEvent`, one per journal
flush, written through the process's group commit."""

from __future__ import annotations

from collections.abc import Mapping

from apps.chat.event_store.base import BATCH, EventCursor, Events, events_after
from apps.chat.feed import event_feed
from apps.chat.models import Message, MessageEvent
from apps.core.aio import db_call
from apps.core.group_commit import budget_writer


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
        return events_after(seq, ((row.seq, row.event, row.data) for row in rows))

    async def aclose(self) -> None:
        pass


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
