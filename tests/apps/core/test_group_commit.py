"""Group commit: writes from many threads, one transaction and one commit per batch; each
write's result or error goes back to its own thread."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.accounts.models import Team
from apps.core.group_commit import GroupCommit
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def in_threads(count: int, target: Any) -> tuple[list[Any], list[BaseException]]:
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = target(index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results, errors


def wait_until(condition: Any) -> None:
    """Poll a condition (a wait for threads to get somewhere, not a timing assertion)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "threads never got there"
        time.sleep(0.005)


def test_writes_waiting_behind_a_commit_go_together_and_each_gets_its_result() -> None:
    group = GroupCommit()
    batches: list[int] = []
    commit = group._commit

    def counted(batch: list[Any]) -> None:
        batches.append(len(batch))
        commit(batch)

    group._commit = counted  # type: ignore[method-assign]
    entered, go = threading.Event(), threading.Event()

    def first() -> int:
        entered.set()
        go.wait(timeout=30)
        return factories.team(name="first").pk

    holder = threading.Thread(target=lambda: (group.run(first), connection.close()))
    holder.start()
    entered.wait(timeout=30)
    outcome: list[tuple[list[Any], list[BaseException]]] = []
    others = threading.Thread(
        target=lambda: outcome.append(
            in_threads(5, lambda i: group.run(lambda: factories.team(name=f"t{i}").name))
        )
    )
    others.start()
    wait_until(lambda: len(group._pending) == 5)
    go.set()
    holder.join(timeout=60)
    others.join(timeout=60)
    results, errors = outcome[0]

    assert not errors
    assert batches == [1, 5]  # the five that queued meanwhile: one transaction
    assert sorted(results) == [f"t{i}" for i in range(5)]
    assert Team.objects.count() == 6


def test_a_failing_write_fails_alone() -> None:
    group = GroupCommit()

    def write(index: int) -> str:
        def create() -> str:
            team = factories.team(name=f"team-{index}")
            if index == 3:
                raise ValueError("this one fails")
            return team.name

        return group.run(create)

    results, errors = in_threads(8, write)
    assert [str(e) for e in errors] == ["this one fails"]
    assert sorted(Team.objects.values_list("name", flat=True)) == sorted(
        f"team-{i}" for i in range(8) if i != 3
    )
    assert sorted(r for r in results if r) == sorted(f"team-{i}" for i in range(8) if i != 3)


def test_inside_a_transaction_it_is_part_of_it() -> None:
    group = GroupCommit()
    with pytest.raises(RuntimeError), transaction.atomic():
        group.run(factories.team, name="rolled back")
        raise RuntimeError
    assert not Team.objects.exists()


def test_inside_a_transaction_a_failing_write_leaves_nothing_and_the_rest_goes_on() -> None:
    group = GroupCommit()

    def half_done() -> None:
        factories.team(name="half")
        raise ValueError("refused")

    with transaction.atomic():
        factories.team(name="before")
        with pytest.raises(ValueError, match="refused"):
            group.run(half_done)
        factories.team(name="after")
    assert sorted(Team.objects.values_list("name", flat=True)) == ["after", "before"]


def test_a_write_alone_is_its_own_transaction_with_no_savepoint() -> None:
    group = GroupCommit()

    def half_done() -> None:
        factories.team(name="half")
        raise ValueError("refused")

    with CaptureQueriesContext(connection) as queries:
        assert group.run(lambda: factories.team(name="alone").name) == "alone"
        with pytest.raises(ValueError, match="refused"):
            group.run(half_done)
    assert list(Team.objects.values_list("name", flat=True)) == ["alone"]
    assert not [q["sql"] for q in queries if "SAVEPOINT" in q["sql"].upper()]


def batched(group: GroupCommit, writes: list[Any]) -> tuple[list[Any], list[BaseException]]:
    """Run ``writes`` through ``group`` as one batch: they queue behind a write that holds
    the writer, then go together."""
    entered, go = threading.Event(), threading.Event()

    def holder() -> None:
        entered.set()
        go.wait(timeout=30)

    first = threading.Thread(target=lambda: (group.run(holder), connection.close()))
    first.start()
    entered.wait(timeout=30)
    outcome: list[tuple[list[Any], list[BaseException]]] = []
    others = threading.Thread(
        target=lambda: outcome.append(in_threads(len(writes), lambda i: group.run(writes[i])))
    )
    others.start()
    wait_until(lambda: len(group._pending) == len(writes))
    go.set()
    first.join(timeout=60)
    others.join(timeout=60)
    return outcome[0]


def test_a_write_failing_a_deferred_constraint_fails_alone_not_its_batch() -> None:
    """A foreign key is checked at commit (deferred, on PostgreSQL and SQLite alike): the
    write that breaks it fails, its own caller hears of it, and the other teams' writes
    in the same batch commit."""
    from apps.chat.models import Message

    group = GroupCommit()
    owner = factories.team(name="owner")
    taken = factories.team(name="taken")

    def dangling() -> None:  # an answer's row for a conversation deleted meanwhile
        Message.objects.create(conversation_id=987654, team=owner, role="assistant")

    def duplicate() -> None:
        factories.team(name=taken.name)

    def write(name: str) -> Any:
        return lambda: factories.team(name=name).name

    writes = [write("a"), dangling, write("b"), duplicate, write("c")]
    results, errors = batched(group, writes)

    assert len(errors) == 2  # the dangling row and the duplicate, each to its own caller
    assert sorted(r for r in results if r) == ["a", "b", "c"]
    assert sorted(Team.objects.values_list("name", flat=True)) == [
        "a",
        "b",
        "c",
        "owner",
        "taken",
    ]
    assert not Message.objects.exists()
