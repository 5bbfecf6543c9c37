"""Group commit: writes from many threads share one transaction, and one commit.

Settling an answer is a handful of small writes, then a commit. Done one answer per
transaction, concurrent answers queue on the commit (a disk flush each) and on the row
locks their writes share (a team's quota counter), so the last of 32 waits for 31 commits.
Here, whoever finds the writer free takes every write pending at that moment and runs them
in one transaction, each in its own savepoint (one that fails rolls back alone and raises
in its own thread), then commits once; the others wait for their result. A commit that
fails (a deferred foreign key is checked only then) runs the batch's writes again, each
alone, so that a write never fails for another's fault, whatever team it belongs to. With no
contention a write goes alone, as it would without this, in a transaction of its own and
no savepoint (two statements fewer); under contention the batches grow on their own. A
write must use only the database and its arguments (it runs on the combining thread and
its connection) and may run twice: once in a batch that failed, then alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS, transaction

P = ParamSpec("P")
R = TypeVar("R")


class _Write(Generic[R]):
    __slots__ = ("call", "done", "error", "value")

    def __init__(self, call: Callable[[], R]) -> None:
        self.call = call
        self.done = False
        self.value: R | None = None
        self.error: BaseException | None = None


class GroupCommit:
    def __init__(self, *, using: str = DEFAULT_DB_ALIAS) -> None:
        self.using = using
        self._writer = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: list[_Write[Any]] = []

    def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` committed, possibly with others' writes; its result, or
        its exception. One that raises leaves nothing behind: it runs in a savepoint of its
        own, or alone in its transaction; inside a transaction already, in a savepoint of
        that one."""
        if transaction.get_connection(self.using).in_atomic_block:
            with transaction.atomic(using=self.using):
                return fn(*args, **kwargs)
        write: _Write[R] = _Write(lambda: fn(*args, **kwargs))
        with self._pending_lock:
            self._pending.append(write)
        with self._writer:
            if not write.done:  # nobody took it while this thread waited
                with self._pending_lock:
                    batch, self._pending = self._pending, []
                self._commit(batch)
        if write.error is not None:
            raise write.error
        return write.value  # type: ignore[return-value]

    def _commit(self, batch: list[_Write[Any]]) -> None:
        try:
            if len(batch) == 1:  # alone, the write is the transaction: no savepoint
                self._alone(batch[0])
            elif not self._together(batch):
                # The commit failed: a deferred constraint (a foreign key, checked only
                # now) or the database itself. Nothing of the batch was kept, and which
                # write broke it is unknown, so each that had succeeded goes again alone:
                # only the one at fault fails, to its own caller.
                for write in batch:
                    if write.error is None:
                        self._alone(write)
        finally:
            for write in batch:
                write.done = True

    def _together(self, batch: list[_Write[Any]]) -> bool:
        """The batch in one transaction, each write in a savepoint (one that raises rolls
        back alone); False if the commit failed."""
        try:
            with transaction.atomic(using=self.using):
                for write in batch:
                    try:
                        with transaction.atomic(using=self.using):
                            write.value = write.call()
                    except Exception as exc:
                        write.error = exc
        except Exception:
            for write in batch:
                write.value = None
            return False
        return True

    def _alone(self, write: _Write[Any]) -> None:
        try:
            with transaction.atomic(using=self.using):
                write.value = write.call()
        except Exception as exc:
            write.value, write.error = None, exc


budget_writer = GroupCommit()
"""What the answer path writes, from every thread of this process: reservations (the
database store), the message rows written while the tier prefills, the event journal's
batches, and each answer's settlement, ledger row and message (see
:mod:`apps.usage.budgets` and the answer run). On SQLite, which has one writer at a time
whatever happens, it also keeps threads from waiting out each other's locks in the busy
handler's back-off (seconds at the tail: docs/gateway.md, admission)."""
