"""What an event store is: where an answer's numbered events are kept, and how a reader
stands in them. Events are numbered 1, 2, 3… per message; each append is one record, a
batch of events, which a read expands again (:func:`events_after`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

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


def events_after(seq: int, records: Iterable[tuple[int, str, Any]]) -> Events:
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
