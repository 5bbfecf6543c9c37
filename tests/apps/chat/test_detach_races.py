"""Races in detached answers (issue 30) a review found, each once a failing test: a
resume's flush of the journal against the group writer, a resume during the look for
readers in Redis (the clock, the gauge, the row's status), and what reading back a long
detached stretch costs the event loop.

Unit level, on :class:`apps.chat.services.detach.AnswerHold`, with fakes for the run, its
journal's store and Redis."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from apps.chat.event_store.base import BATCH, events_after
from apps.chat.services import detach
from apps.chat.services.detach import AnswerHold
from apps.chat.services.journal import Journal
from apps.chat.services.types import Delta
from apps.usage import metrics

pytestmark = pytest.mark.django_db  # nothing here writes; the suite's teardown needs one


def _inline(fn: Any) -> Any:
    async def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return call


class SlowFirstStore:
    """An event store whose first append waits on ``gate``; later ones land at once (two
    writes on two Redis connections, or two pool threads sealing batches of two sizes)."""

    def __init__(self) -> None:
        self.records: list[tuple[int, str, Any]] = []
        self.gate = asyncio.Event()
        self.calls = 0

    async def append(self, message_id: int, events: Any) -> None:
        await self.append_many({message_id: events})

    async def append_many(self, batches: Any) -> None:
        self.calls += 1
        if self.calls == 1:
            await self.gate.wait()
        for events in batches.values():
            self.records.append((events[-1][0], BATCH, events))

    async def aclose(self) -> None:
        pass


async def test_a_resume_flush_races_the_group_writer_and_loses_events_from_the_log() -> None:
    """``attach`` flushes the journal in the background while the answer goes on: the group
    writer must not take the next events and store them first, since readers skip what is
    numbered below what they hold (``events_after``)."""
    store = SlowFirstStore()
    journal = Journal(keep=True)
    journal.store = store  # type: ignore[assignment]
    assert journal.writer is not None
    journal.writer.store = store  # type: ignore[assignment]
    journal.message_id = 1
    run = SimpleNamespace(message_id=1, journal=journal, hold=None)
    hold = AnswerHold(run, grace=20)  # type: ignore[arg-type]
    hold.readers = 1  # the connection still reads: no status write
    for i in range(3):
        journal.add(Delta(text=f" a{i}"))
    hold.attach(0)  # a resume: events 1..3 flushed in the background
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    for i in range(2):  # the answer goes on
        journal.add(Delta(text=f" b{i}"))
    await journal.writer.write()  # the group writer's next round (every 0.25 s): not now
    store.gate.set()
    await asyncio.sleep(0.05)
    await journal.writer.write()  # the round after: what waited goes out, after 1..3
    journal.writer.dirty.discard(journal)
    replayed = [seq for seq, _, _ in events_after(0, store.records)]
    assert replayed == [1, 2, 3, 4, 5], f"a replay from 0 reads {replayed}"


async def _resume_during_the_redis_look(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[float, list[str]]:
    """The grace runs out; while ``_expire_unless_read`` awaits Redis, a resume comes and
    goes (a fresh clock); then Redis says "read" (the mark that very resume set, which
    lives READING_TTL_SECONDS after it left); then the answer ends. The gauge's change
    over it all, and the status writes."""
    settings.STREAM_BUFFER_REDIS_URL = "redis://unused"
    looked = asyncio.Event()
    answer = asyncio.Event()
    writes: list[str] = []

    async def read_elsewhere(message_id: int) -> bool:
        looked.set()
        await answer.wait()
        return True

    monkeypatch.setattr(detach, "read_elsewhere", read_elsewhere)
    monkeypatch.setattr(detach, "_status_write", lambda _id, status: writes.append(str(status)))
    monkeypatch.setattr(detach, "db_call", _inline)

    async def flush() -> None:
        pass

    run = SimpleNamespace(
        message_id=7, journal=SimpleNamespace(flush=flush), hold=None, detach_expired=lambda: None
    )
    before = metrics.DETACHED._value.get()
    hold = AnswerHold(run, grace=0.01)  # type: ignore[arg-type]
    hold.leave(hold.client)  # the client dropped
    await asyncio.wait_for(looked.wait(), 2)  # the grace ran out: looking in Redis
    hold.grace = 30
    reading = hold.attach(0)  # a resume ...
    await asyncio.sleep(0.01)
    hold.leave(reading)  # ... that leaves again: a fresh 30 s clock
    answer.set()
    await asyncio.sleep(0.01)
    hold.over = True  # the answer ends (what _produce's finally does)
    hold._stop_clock()
    return metrics.DETACHED._value.get() - before, writes


async def test_a_resume_during_the_redis_look_leaks_a_timer_and_the_detached_gauge(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_expire_unless_read`` must not re-arm a clock when a resume that came and went
    during its Redis look armed one: ``ragtier_answers_detached`` comes back down."""
    change, _ = await _resume_during_the_redis_look(settings, monkeypatch)
    assert change == 0, f"ragtier_answers_detached left at +{change} after the answer ended"


async def test_a_resume_during_the_redis_look_leaves_the_row_detached_while_read(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume during the Redis look (no clock armed) still says ``streaming``."""
    _, writes = await _resume_during_the_redis_look(settings, monkeypatch)
    assert "streaming" in writes, f"status writes: {writes}"


async def test_reading_back_a_long_detached_stretch_costs_linear_time(
    settings: Any,
) -> None:
    """120 s of grace at 100 tokens/s is 12,000 unread events: handing them to a resume,
    and counting what stayed unread, is linear work on the event loop every stream of
    the process shares (each read once; the count once, at settlement)."""
    settings.STREAM_BUFFER_REDIS_URL = ""

    async def flush() -> None:
        pass

    run = SimpleNamespace(message_id=1, hold=None, journal=SimpleNamespace(flush=flush))
    hold = AnswerHold(run, grace=20)  # type: ignore[arg-type]
    n = 12_000
    hold.unread = [(i, " w") for i in range(1, n + 1)]
    hold.client.open = False
    reading = hold.attach(0)
    for seq in range(1, n // 2 + 1):
        reading.read(seq)
    hold.leave(reading)
    unread = await hold.unread_tokens(lambda text: len(text.split()))
    assert unread == n // 2  # the second half was never handed to anyone
    hold._stop_clock()
