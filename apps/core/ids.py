"""Primary keys known before their row is written.

An answer's first event names its message, but writing the message rows (an insert and a
commit) before the first token would put the database on the path to it. Instead a
process takes keys from the table's own sequence a block at a time (one statement per
``BLOCK_SIZE`` rows), hands them out with no I/O, and the rows are written with those
keys while the answer streams. Keys come from the same sequence the table's inserts use,
so explicit and automatic keys never collide, across processes too.

PostgreSQL: ``nextval`` of the identity sequence. SQLite: the ``AUTOINCREMENT`` counter
in ``sqlite_sequence``, moved on under the database's write lock. Keys skipped by a
process that stops are never reused, as with any sequence.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque

from django.db import connection, models, transaction

from apps.core.aio import db_call, loop_cached
from apps.core.fields import column_of

BLOCK_SIZE = 1024
"""Keys per statement. Whoever finds a block empty waits for the next one, and so does
every thread or answer that asks meanwhile: with 64, one reservation in 64 and those
beside it waited a database round trip (the admission bench's p99 under 32 threads);
keys left in a block when a process stops are skipped, as a sequence skips them."""


class KeyBlock:
    """Keys of one table for this event loop, refilled ``BLOCK_SIZE`` at a time."""

    def __init__(self, model: type[models.Model], *, size: int = BLOCK_SIZE) -> None:
        self.model = model
        self.size = size
        self.keys: deque[int] = deque()
        self.lock = asyncio.Lock()

    async def take(self) -> int:
        if not self.keys:
            async with self.lock:
                if not self.keys:
                    self.keys.extend(await db_call(keys_allocate)(self.model, count=self.size))
        return self.keys.popleft()


@loop_cached
def key_block(model: type[models.Model]) -> KeyBlock:
    return KeyBlock(model)


async def key_next(model: type[models.Model]) -> int:
    """A primary key for a ``model`` row not written yet (usually no I/O)."""
    return await key_block(model).take()


_taken: dict[tuple[int, type[models.Model]], deque[int]] = {}
_taking = threading.Lock()


def key_take(model: type[models.Model]) -> int:
    """:func:`key_next` for synchronous code (any thread): a key from a block of this
    process's (a forked child takes its own). Call it outside any transaction: on SQLite
    a rolled-back allocation would hand the same keys to another process."""
    with _taking:
        keys = _taken.setdefault((os.getpid(), model), deque())
        if not keys:
            keys.extend(keys_allocate(model, count=BLOCK_SIZE))
        return keys.popleft()


def keys_allocate(model: type[models.Model], *, count: int) -> list[int]:
    """``count`` keys from ``model``'s sequence, never handed out to anyone else."""
    table, column = model._meta.db_table, column_of(model._meta.pk)
    quote = connection.ops.quote_name
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
                [quote(table), column, count],
            )
            return [row[0] for row in cursor.fetchall()]
        if connection.vendor == "sqlite":
            # The highest of the counter and the table's largest key, moved on by count;
            # the UPDATE takes the write lock first, so no two processes get one range.
            highest = f"(SELECT coalesce(max({quote(column)}), 0) FROM {quote(table)})"  # noqa: S608
            cursor.execute(
                f"UPDATE sqlite_sequence SET seq = max(seq, {highest}) + %s "  # noqa: S608
                "WHERE name = %s RETURNING seq",
                [count, table],
            )
            row = cursor.fetchone()
            if row is None:  # the table has had no insert yet
                cursor.execute(
                    f"INSERT INTO sqlite_sequence (name, seq) SELECT %s, {highest} + %s "
                    "RETURNING seq",
                    [table, count],
                )
                row = cursor.fetchone()
            last = int(row[0])
            return list(range(last - count + 1, last + 1))
    raise NotImplementedError(f"keys_allocate: no support for {connection.vendor}")
