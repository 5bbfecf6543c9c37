"""Cancel requests for the answers this process streams (``POST …/cancel``, a delete of
the conversation), asked in any process and read from the database."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from django.db import DatabaseError

from apps.chat.models import Message
from apps.core.aio import db_call, loop_cached

logger = logging.getLogger(__name__)

CANCEL_POLL_SECONDS = 0.25


class CancelWatch:
    """Cancel requests for every answer this process streams, read in one query every
    ``CANCEL_POLL_SECONDS`` (not one query per answer per flush: a thousand open streams
    would be a thousand queries a second)."""

    def __init__(self) -> None:
        self.events: dict[int, tuple[asyncio.Event, Callable[[], None]]] = {}
        self.task: asyncio.Task[None] | None = None

    def watch(self, message_id: int, on_cancel: Callable[[], None]) -> asyncio.Event:
        """An event set (and ``on_cancel`` called) once a cancel of the answer is asked."""
        event, _ = self.events.setdefault(message_id, (asyncio.Event(), on_cancel))
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._poll())
        return event

    def forget(self, message_id: int) -> None:
        self.events.pop(message_id, None)

    async def _poll(self) -> None:
        while self.events:
            await asyncio.sleep(CANCEL_POLL_SECONDS)
            try:
                asked = await db_call(_cancel_requested_among)(list(self.events))
            except DatabaseError as exc:  # the next round tries again
                logger.warning("cannot read cancel requests: %s", exc)
                continue
            for message_id in asked:
                if message_id in self.events:
                    event, on_cancel = self.events[message_id]
                    if not event.is_set():
                        event.set()
                        on_cancel()


@loop_cached
def cancel_watch() -> CancelWatch:
    return CancelWatch()


def _cancel_requested_among(message_ids: list[int]) -> list[int]:
    asked = Message.objects.filter(pk__in=message_ids, cancel_requested=True)
    return list(asked.values_list("pk", flat=True))
