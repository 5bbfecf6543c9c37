"""Faults in real Celery worker processes: killed mid-document, crashing, running past
their time or memory limits; and fairness between teams, measured through the worker.

Each test starts prefork workers (as ``runstack`` does) over real Redis on this test's
database; the faults come from ``tests.apps.knowledge.sabotage``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from apps.accounts.models import Team
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import collection_index_load, document_create_from_text
from apps.knowledge.services.dispatch import TASKS
from apps.usage.models import Reservation, UsageRecord
from config.celery import app as celery_app
from retrieval import embedding_text
from retrieval.embedders import FakeEmbedder
from tests import factories
from tests.apps.knowledge.conftest import Worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DONE = ("indexed", "failed")
# 200 sections of 40 words: one chunk each (a chunk never crosses a heading).
TEXT_200 = "\n\n".join(
    f"## Part {i}\n\n" + " ".join(f"word{i}x{j}" for j in range(40)) for i in range(200)
)


def submit(collection: Collection, text: str, *, title: str = "Doc") -> Document:
    """Accept a document the way the API does: queued, dispatched after commit."""
    return document_create_from_text(
        collection=collection, title=title, text=text, format="markdown"
    ).document


def status(document: Document) -> str:
    return str(Document.objects.values_list("status", flat=True).get(pk=document.pk))


def time_limits(monkeypatch: pytest.MonkeyPatch, *, soft: int, hard: int) -> dict[str, str]:
    """Give the stage tasks these limits here and, through the returned environment, in a
    worker: whoever sends a task stamps its own limits on the message (Celery), and this
    process sends each document's first one."""
    for name in TASKS.values():
        task = celery_app.tasks[name]
        monkeypatch.setattr(task, "soft_time_limit", soft)
        monkeypatch.setattr(task, "time_limit", hard)
        monkeypatch.setattr(task, "_exec_options", None)
    return {"CELERY_TASK_SOFT_TIME_LIMIT": str(soft), "CELERY_TASK_TIME_LIMIT": str(hard)}


def parses(tmp_path: Path, marker: str) -> int:
    """How many times a parse of a document starting with ``marker`` began."""
    log = tmp_path / "sabotage.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines if line.split(" ", 1)[1].startswith(marker))


def test_a_worker_killed_halfway_through_200_chunks_resumes_and_charges_once(
    start_worker: Callable[..., Worker], team: Team
) -> None:
    env = {
        "EMBEDDER_BACKEND": "tests.apps.knowledge.sabotage.SlowFakeEmbedder",
        "SLOW_EMBED_SECONDS": "0.02",
        "EMBED_BATCH_SIZE": "10",
        "INGEST_EMBED_SLICE_SECONDS": "1",
        # How soon Redis hands a dead worker's unacknowledged message out again.
        "TEST_BROKER_VISIBILITY_TIMEOUT": "3",
    }
    worker = start_worker(**env)
    document = submit(factories.collection(team=team), TEXT_200)
    embedded = Chunk.objects.filter(document=document, embedding__isnull=False)
    wait_for(lambda: embedded.count() >= 100, worker=worker, what="half the embeddings")
    worker.kill()
    at_kill = embedded.count()
    killed = Document.objects.get(pk=document.pk)
    assert (killed.stage, killed.status, killed.chunk_count) == ("embed", "processing", 200)
    assert 100 <= at_kill < 200

    restarted = start_worker(**env)
    wait_for(lambda: status(document) in DONE, worker=restarted, what="the document")
    document.refresh_from_db()
    assert (document.status, document.error, document.progress) == ("indexed", "", 100)
    chunks = list(Chunk.objects.filter(document=document))
    assert len(chunks) == document.chunk_count == 200
    assert all(chunk.embedding is not None for chunk in chunks)
    collection = document.collection
    collection.refresh_from_db()
    index = collection_index_load(collection)
    assert len(index) == Chunk.objects.filter(collection=collection).count() == 200
    assert set(index.ids().tolist()) == {chunk.pk for chunk in chunks}
    # Every chunk's tokens charged exactly once: the batch lost with the worker is
    # embedded again, but its tokens had not been committed.
    expected = FakeEmbedder().count_embedding_tokens(
        [embedding_text(document.title, tuple(c.headings), c.text) for c in chunks]
    )
    usage = UsageRecord.objects.get(operation="ingest", object_id=str(document.pk))
    assert usage.prompt_tokens == document.embedding_tokens == expected
    assert usage.status == "ok"
    reservation = Reservation.objects.get(pk=document.reservation_id)
    assert reservation.settled_at is not None and reservation.actual_tokens == expected
    assert document.lost_deliveries == 0


def test_a_document_that_crashes_the_worker_is_quarantined_after_three_deliveries(
    start_worker: Callable[..., Worker], team: Team, tmp_path: Path
) -> None:
    worker = start_worker()
    collection = factories.collection(team=team)
    poison = submit(collection, "CRASH the worker whenever this is parsed.", title="Poison")
    healthy = submit(collection, "A plain document about the pantry key.", title="Healthy")
    wait_for(
        lambda: status(poison) in DONE and status(healthy) in DONE,
        worker=worker,
        what="both documents",
    )
    poison.refresh_from_db()
    assert poison.status == "failed"
    assert poison.error.startswith("worker_crashed: the document is quarantined")
    assert "died 3 times during its parse stage" in poison.error
    assert parses(tmp_path, "CRASH") == 3  # run three times, never a fourth
    assert status(healthy) == "indexed"  # the worker kept serving everyone else
    assert worker.alive()


def test_a_stage_past_the_soft_time_limit_fails_the_document(
    start_worker: Callable[..., Worker], team: Team, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = start_worker(**time_limits(monkeypatch, soft=2, hard=30))
    collection = factories.collection(team=team)
    slow = submit(collection, "SLOW to parse, far past the limit.", title="Slow")
    healthy = submit(collection, "A plain document about the pantry key.", title="Healthy")
    wait_for(
        lambda: status(slow) in DONE and status(healthy) in DONE,
        worker=worker,
        what="both documents",
    )
    slow.refresh_from_db()
    assert slow.status == "failed"
    assert slow.error == ("time_limit_exceeded: the parse stage ran past its time limit of 2 s")
    assert parses(tmp_path, "SLOW") == 1  # failed at once, not retried
    assert status(healthy) == "indexed"


def test_a_stage_deaf_to_the_soft_limit_is_killed_at_the_hard_one_and_quarantined(
    start_worker: Callable[..., Worker], team: Team, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = start_worker(**time_limits(monkeypatch, soft=1, hard=3))
    collection = factories.collection(team=team)
    hung = submit(collection, "HANG in the parser, deaf to the soft limit.", title="Hung")
    healthy = submit(collection, "A plain document about the pantry key.", title="Healthy")
    wait_for(
        lambda: status(hung) in DONE and status(healthy) in DONE,
        worker=worker,
        what="both documents",
    )
    hung.refresh_from_db()
    assert hung.status == "failed"
    assert hung.error.startswith("worker_crashed: the document is quarantined")
    assert "hard time limit of 3 s" in hung.error
    assert parses(tmp_path, "HANG") == 3
    assert status(healthy) == "indexed"
    assert worker.alive()


def test_a_stage_past_the_memory_cap_fails_the_document(
    start_worker: Callable[..., Worker], team: Team, tmp_path: Path
) -> None:
    worker = start_worker(WORKER_CHILD_MEMORY_LIMIT_MB="1024")
    collection = factories.collection(team=team)
    hog = submit(collection, "HOG memory: two GiB for one page.", title="Hog")
    healthy = submit(collection, "A plain document about the pantry key.", title="Healthy")
    wait_for(
        lambda: status(hog) in DONE and status(healthy) in DONE,
        worker=worker,
        what="both documents",
    )
    hog.refresh_from_db()
    assert (hog.status, hog.error) == ("failed", "out_of_memory: the parse stage ran out of memory")
    assert parses(tmp_path, "HOG") == 1
    assert status(healthy) == "indexed"


def test_one_teams_backlog_does_not_hold_up_another_teams_first_document(
    start_worker: Callable[..., Worker], team: Team, other_team: Team, settings: Any
) -> None:
    """50 documents from one team, then 1 from another, all queued before a worker
    starts: the second team's document is among the first INGEST_MAX_IN_FLIGHT + 1 to
    finish (first come first served, it would be the 51st)."""
    backlog = factories.collection(team=team)
    for i in range(50):
        submit(backlog, f"Backlog document {i} about shelf {i}.", title=f"A{i}")
    first = submit(factories.collection(team=other_team), "The other team's first document.")
    in_flight = settings.INGEST_MAX_IN_FLIGHT
    assert Document.objects.filter(dispatched_at__isnull=False).count() == in_flight
    assert Document.objects.get(pk=first.pk).dispatched_at is None  # waits its turn

    worker = start_worker()
    wait_for(
        lambda: Document.objects.filter(status="indexed").count() == 51,
        worker=worker,
        timeout=300,
        what="51 documents",
    )
    finished = list(Document.objects.order_by("indexed_at", "pk").values_list("pk", flat=True))
    position = finished.index(first.pk) + 1
    print(f"\nthe other team's first document finished {position} of 51")
    assert position <= in_flight + 1
