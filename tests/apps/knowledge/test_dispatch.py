"""The fair dispatcher and the stage runner, in this process (the worker's side of it is
in test_worker_faults.py): who is sent to the workers when, what a delivery counts, how a
stage that times out, runs out of memory or keeps killing its worker ends."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import OperationalError
from django.utils import timezone

from apps.accounts.models import Team
from apps.knowledge.models import Chunk, Collection, Document, IngestionShare
from apps.knowledge.services import (
    STAGE_FUNCTIONS,
    dispatch,
    document_create_from_text,
    documents_requeue_stalled,
    embedder,
)
from apps.knowledge.services.dispatch import ingestion_dispatch
from apps.knowledge.services.ingestion import ingestion_stage_run
from apps.usage.models import Limit, Reservation, UsageRecord
from config.celery import app as celery_app
from retrieval import Embeddings, FakeEmbedder, embedding_text
from tests import factories

pytestmark = pytest.mark.django_db

TEXT = "\n\n".join(
    f"## Part {i}\n\n" + " ".join(f"word{i}x{j}" for j in range(40)) for i in range(6)
)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """What would go to the broker, in order: (document id, stage)."""
    calls: list[tuple[int, str]] = []
    monkeypatch.setattr(dispatch, "_send", lambda pk, stage: calls.append((pk, stage)))
    return calls


@pytest.fixture
def queued(settings: Any) -> Iterator[None]:
    """Tasks go through a broker (not run eagerly), with two documents at the workers."""
    settings.INGEST_MAX_IN_FLIGHT = 2
    saved, celery_app.conf.task_always_eager = celery_app.conf.task_always_eager, False
    try:
        yield
    finally:
        celery_app.conf.task_always_eager = saved


def submit(collection: Collection, text: str, *, title: str = "Doc") -> Document:
    """Accept a document and put it in line, as the API does (the dispatch after commit
    is called by the tests themselves)."""
    document = document_create_from_text(
        collection=collection, title=title, text=text, format="markdown", enqueue=False
    ).document
    dispatch.ingestion_enqueue(document=document)
    return document


def finish(document: Document) -> None:
    Document.objects.filter(pk=document.pk).update(status="indexed", stage="done")


def test_another_teams_first_document_takes_the_next_free_place(
    team: Team, other_team: Team, queued: None, sent: list[tuple[int, str]]
) -> None:
    backlog = factories.collection(team=team)
    a = [submit(backlog, f"Backlog document {i}.", title=f"A{i}") for i in range(5)]
    assert ingestion_dispatch() == [a[0].pk, a[1].pk]  # two places, both taken
    b = submit(factories.collection(team=other_team), "The other team's first document.")
    assert ingestion_dispatch() == []  # no place free: it waits, and so do A's

    finish(a[0])
    assert ingestion_dispatch() == [b.pk]  # not A's third, though it came first
    finish(a[1])
    assert ingestion_dispatch() == [a[2].pk]
    assert sent == [(a[0].pk, "parse"), (a[1].pk, "parse"), (b.pk, "parse"), (a[2].pk, "parse")]
    dispatched = Document.objects.filter(dispatched_at__isnull=False)
    assert set(dispatched.values_list("pk", flat=True)) == {a[0].pk, a[1].pk, a[2].pk, b.pk}


def test_free_places_alternate_between_teams_with_a_backlog(
    team: Team, other_team: Team, queued: None, settings: Any, sent: list[tuple[int, str]]
) -> None:
    settings.INGEST_MAX_IN_FLIGHT = 4
    mine, theirs = factories.collection(team=team), factories.collection(team=other_team)
    a = [submit(mine, f"A {i}.", title=f"A{i}") for i in range(4)]
    b = [submit(theirs, f"B {i}.", title=f"B{i}") for i in range(3)]
    # A waited longest, so A first; then the team with fewer at the workers.
    assert ingestion_dispatch() == [a[0].pk, b[0].pk, a[1].pk, b[1].pk]


def used(team: Team, seconds: float, *, ago: float = 0.0) -> None:
    """The team has used the workers for ``seconds``, as counted ``ago`` seconds back."""
    IngestionShare.objects.update_or_create(
        team=team,
        defaults={"seconds": seconds, "updated_at": timezone.now() - timedelta(seconds=ago)},
    )


def test_the_team_that_has_used_the_workers_least_lately_goes_first(
    team: Team, other_team: Team, queued: None, settings: Any, sent: list[tuple[int, str]]
) -> None:
    settings.INGEST_MAX_IN_FLIGHT = 1
    mine, theirs = factories.collection(team=team), factories.collection(team=other_team)
    a = submit(mine, "A's next document.", title="A")
    b = submit(theirs, "B's first document.", title="B")
    used(team, 30.0)  # e.g. documents it has deleted since, or sent one at a time
    assert ingestion_dispatch() == [b.pk]  # though A's has waited longer

    finish(b)
    used(other_team, 31.0)
    b2 = submit(theirs, "B's second document.", title="B2")
    assert ingestion_dispatch() == [a.pk]  # B has used the workers more now
    assert b2.pk not in [pk for pk, _ in sent]


def test_what_a_team_used_fades_by_half_every_half_life(
    team: Team, other_team: Team, queued: None, settings: Any, sent: list[tuple[int, str]]
) -> None:
    settings.INGEST_MAX_IN_FLIGHT = 1
    half_life = settings.INGEST_FAIR_HALF_LIFE_SECONDS
    used(team, 64.0, ago=6 * half_life)  # 1 s now
    used(other_team, 1.5)
    a = submit(factories.collection(team=team), "A's document.", title="A")
    submit(factories.collection(team=other_team), "B's document.", title="B")
    assert ingestion_dispatch() == [a.pk]

    dispatch.ingestion_share_add(team_id=team.pk, seconds=2.0)
    share = IngestionShare.objects.get(team=team)
    assert share.seconds == pytest.approx(3.0, abs=0.01)  # 64 halved six times, plus 2


@pytest.mark.parametrize(("quantum", "follows"), [(2.0, True), (0.0, False)])
def test_a_stage_is_followed_at_once_while_its_team_is_within_the_quantum(
    quantum: float,
    follows: bool,
    team: Team,
    other_team: Team,
    queued: None,
    settings: Any,
    sent: list[tuple[int, str]],
) -> None:
    settings.INGEST_MAX_IN_FLIGHT = 1
    settings.INGEST_FAIR_QUANTUM_SECONDS = quantum
    running = submit(factories.collection(team=team), TEXT, title="Running")
    ingestion_dispatch()
    waiting = submit(factories.collection(team=other_team), TEXT, title="Waiting")

    ingestion_stage_run(document_id=running.pk, stage="parse")  # a few ms of the workers

    running.refresh_from_db()
    assert running.worker_seconds > 0
    if follows:
        assert sent == [(running.pk, "parse"), (running.pk, "chunk")]
        assert running.dispatched_at is not None
    else:  # the other team has used the workers less: the place is theirs
        assert sent == [(running.pk, "parse"), (waiting.pk, "parse")]
        assert running.dispatched_at is None and running.stage == "chunk"


def test_each_stage_gives_its_place_back_to_the_team_next_in_turn(
    team: Team, other_team: Team, queued: None, settings: Any, sent: list[tuple[int, str]]
) -> None:
    """A document does not keep its place from one stage to the next: a slow file of one
    team (a parse of seconds) stands in front of another team's document once at most."""
    settings.INGEST_MAX_IN_FLIGHT = 1
    slow = submit(factories.collection(team=team), TEXT, title="Slow")
    ingestion_dispatch()
    ordinary = submit(factories.collection(team=other_team), TEXT, title="Ordinary")
    used(team, 5.0)  # its earlier parses

    ingestion_stage_run(document_id=slow.pk, stage="parse")
    for stage in ("parse", "chunk", "embed", "index"):
        ingestion_stage_run(document_id=ordinary.pk, stage=stage)

    assert sent == [
        (slow.pk, "parse"),
        (ordinary.pk, "parse"),  # the place the slow one's parse gave back
        (ordinary.pk, "chunk"),
        (ordinary.pk, "embed"),
        (ordinary.pk, "index"),
        (slow.pk, "chunk"),  # its turn again once the other team has nothing waiting
    ]
    slow.refresh_from_db()
    assert (slow.stage, slow.status, slow.dispatched_at is not None) == (
        "chunk",
        "processing",
        True,
    )
    assert slow.worker_seconds > 0  # the parse's own time
    assert IngestionShare.objects.get(team=team).seconds > 5.0  # and its team's
    assert Document.objects.get(pk=ordinary.pk).status == "indexed"


def test_without_a_cap_documents_go_first_come_first_served(
    team: Team, other_team: Team, queued: None, settings: Any, sent: list[tuple[int, str]]
) -> None:
    settings.INGEST_MAX_IN_FLIGHT = 0
    mine = factories.collection(team=team)
    a = [submit(mine, "A 0.", title="A0"), submit(mine, "A 1.", title="A1")]
    b = submit(factories.collection(team=other_team), "B 0.")
    assert ingestion_dispatch() == [a[0].pk, a[1].pk, b.pk]


def test_a_document_is_dispatched_once_and_resumes_at_its_stage(
    team: Team, queued: None, sent: list[tuple[int, str]]
) -> None:
    document = submit(factories.collection(team=team), TEXT)
    STAGE_FUNCTIONS["parse"](document_id=document.pk)
    assert ingestion_dispatch() == [document.pk]
    assert ingestion_dispatch() == []  # in flight already
    assert sent == [(document.pk, "chunk")]


def test_the_sweep_leaves_documents_waiting_their_turn_alone(
    team: Team, queued: None, settings: Any, sent: list[tuple[int, str]]
) -> None:
    settings.INGEST_MAX_IN_FLIGHT = 1
    collection = factories.collection(team=team)
    first, second = submit(collection, "First."), submit(collection, "Second.")
    ingestion_dispatch()
    long_ago = timezone.now() - timedelta(hours=2)
    Document.objects.update(updated_at=long_ago)
    assert documents_requeue_stalled() == (1, 0)  # the one at the workers; not the other
    assert Document.objects.get(pk=second.pk).attempts == 1
    # The stalled one went back to the end of its team's line; the place went on.
    assert sent == [(first.pk, "parse"), (second.pk, "parse")]
    assert Document.objects.get(pk=first.pk).attempts == 2


def test_each_stage_sends_the_next_and_the_last_frees_a_place(
    team: Team, queued: None, settings: Any, sent: list[tuple[int, str]]
) -> None:
    settings.INGEST_MAX_IN_FLIGHT = 1
    collection = factories.collection(team=team)
    first, second = submit(collection, TEXT, title="First"), submit(collection, "Next.")
    ingestion_dispatch()
    for stage in ("parse", "chunk", "embed", "index"):
        ingestion_stage_run(document_id=first.pk, stage=stage)
    assert Document.objects.get(pk=first.pk).status == "indexed"
    assert sent == [
        (first.pk, "parse"),
        (first.pk, "chunk"),
        (first.pk, "embed"),
        (first.pk, "index"),
        (second.pk, "parse"),  # the place the first one left
    ]
    ingestion_stage_run(document_id=first.pk, stage="embed")  # a stale re-delivery
    assert len(sent) == 5 and Document.objects.get(pk=first.pk).lost_deliveries == 0


def test_a_stage_redelivered_after_it_moved_the_document_on_sends_the_next_one(
    team: Team, queued: None, sent: list[tuple[int, str]]
) -> None:
    """The worker died between committing the parse stage and sending the chunk task."""
    document = submit(factories.collection(team=team), TEXT)
    ingestion_dispatch()
    STAGE_FUNCTIONS["parse"](document_id=document.pk)  # committed; nothing sent

    ingestion_stage_run(document_id=document.pk, stage="parse")  # the re-delivery

    assert sent == [(document.pk, "parse"), (document.pk, "chunk")]
    assert Document.objects.get(pk=document.pk).stage == "chunk"  # not parsed again


def test_the_embed_stage_works_in_slices_and_charges_once(
    team: Team, settings: Any, sent: list[tuple[int, str]]
) -> None:
    settings.EMBED_BATCH_SIZE = 2
    settings.INGEST_EMBED_SLICE_SECONDS = 0  # one batch per delivery
    document = submit(factories.collection(team=team), TEXT)
    for stage in ("parse", "chunk"):
        ingestion_stage_run(document_id=document.pk, stage=stage)
    deliveries = 0
    while Document.objects.get(pk=document.pk).stage == "embed":
        ingestion_stage_run(document_id=document.pk, stage="embed")
        deliveries += 1
    document.refresh_from_db()
    assert deliveries == 3  # 6 chunks, 2 a batch; each slice sends the stage again
    assert sent.count((document.pk, "embed")) == 3 and sent[-1] == (document.pk, "index")
    assert (document.stage, document.lost_deliveries) == ("index", 0)
    usage = UsageRecord.objects.get(operation="ingest", object_id=str(document.pk))
    assert usage.prompt_tokens == document.embedding_tokens == exact_cost(document)


def test_a_batch_a_duplicate_delivery_committed_first_is_not_charged_twice(
    team: Team, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.EMBED_BATCH_SIZE = 2
    document = submit(factories.collection(team=team), TEXT)
    for stage in ("parse", "chunk"):
        STAGE_FUNCTIONS[stage](document_id=document.pk)
    model = embedder()
    real = model.embed
    calls = {"n": 0}

    def embed(texts: Sequence[str]) -> Embeddings:
        calls["n"] += 1
        if calls["n"] == 1:  # meanwhile, a second delivery commits the same first batch
            STAGE_FUNCTIONS["embed"](document_id=document.pk, slice_seconds=0)
        return real(texts)

    monkeypatch.setattr(model, "embed", embed)
    STAGE_FUNCTIONS["embed"](document_id=document.pk)
    document.refresh_from_db()
    assert document.stage == "index"
    assert document.embedding_tokens == exact_cost(document)
    assert UsageRecord.objects.get(operation="ingest").prompt_tokens == exact_cost(document)


def exact_cost(document: Document) -> int:
    chunks = Chunk.objects.filter(document=document)
    return FakeEmbedder().count_embedding_tokens(
        [embedding_text(document.title, tuple(c.headings), c.text) for c in chunks]
    )


def broken_stage(monkeypatch: pytest.MonkeyPatch, stage: str, error: BaseException) -> list[int]:
    """Make ``stage`` raise ``error``; the calls it got."""
    calls: list[int] = []

    def run(*, document_id: int, **_: object) -> None:
        calls.append(document_id)
        raise error

    monkeypatch.setitem(STAGE_FUNCTIONS, stage, run)
    return calls


def test_a_stage_past_the_soft_time_limit_fails_the_document(
    team: Team, monkeypatch: pytest.MonkeyPatch, sent: list[tuple[int, str]]
) -> None:
    document = submit(factories.collection(team=team), TEXT)
    broken_stage(monkeypatch, "parse", SoftTimeLimitExceeded())
    ingestion_stage_run(document_id=document.pk, stage="parse")
    document.refresh_from_db()
    assert document.status == "failed"
    assert document.error.startswith("time_limit_exceeded: the parse stage ran past")
    assert document.lost_deliveries == 0


def test_a_stage_out_of_memory_fails_the_document(
    team: Team, monkeypatch: pytest.MonkeyPatch, sent: list[tuple[int, str]]
) -> None:
    document = submit(factories.collection(team=team), TEXT)
    broken_stage(monkeypatch, "parse", MemoryError())
    ingestion_stage_run(document_id=document.pk, stage="parse")
    document.refresh_from_db()
    assert (document.status, document.error) == (
        "failed",
        "out_of_memory: the parse stage ran out of memory",
    )


def test_a_transient_error_is_not_a_lost_delivery(
    team: Team, monkeypatch: pytest.MonkeyPatch, sent: list[tuple[int, str]]
) -> None:
    document = submit(factories.collection(team=team), TEXT)
    broken_stage(monkeypatch, "parse", OperationalError("database restarting"))
    for _ in range(5):  # the task's autoretry
        with pytest.raises(OperationalError):
            ingestion_stage_run(document_id=document.pk, stage="parse")
    document.refresh_from_db()
    assert (document.status, document.lost_deliveries) == ("queued", 0)


def test_a_stage_that_keeps_killing_its_worker_is_quarantined_on_the_fourth_delivery(
    team: Team,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    queued: None,
    sent: list[tuple[int, str]],
) -> None:
    settings.EMBED_BATCH_SIZE = 2
    settings.INGEST_MAX_IN_FLIGHT = 1
    Limit.objects.create(team=team, daily_tokens=100_000)
    collection = factories.collection(team=team)
    document = submit(collection, TEXT, title="Poison")
    waiting = submit(collection, "Next in line.", title="Next")
    assert ingestion_dispatch() == [document.pk]
    for stage in ("parse", "chunk"):
        ingestion_stage_run(document_id=document.pk, stage=stage)
    calls = broken_stage(monkeypatch, "embed", SystemExit())  # the process being killed
    for _ in range(3):
        with pytest.raises(SystemExit):
            ingestion_stage_run(document_id=document.pk, stage="embed")
    assert Document.objects.get(pk=document.pk).lost_deliveries == 3

    ingestion_stage_run(document_id=document.pk, stage="embed")  # the fourth delivery

    document.refresh_from_db()
    assert len(calls) == 3  # never run a fourth time
    assert document.status == "failed"
    assert document.error.startswith("worker_crashed: the document is quarantined; the worker")
    assert "died 3 times during its embed stage" in document.error
    assert not Reservation.objects.filter(team=team, settled_at__isnull=True).exists()
    assert sent[-1] == (waiting.pk, "parse")  # its place goes to the next document


def test_a_stage_task_that_gives_up_fails_its_document_and_hands_its_place_on(
    team: Team, queued: None, settings: Any, sent: list[tuple[int, str]]
) -> None:
    """An error the task does not retry (or its last retry): not a place held until the
    stalled sweep, with every team's ingestion waiting behind it."""
    from apps.knowledge.tasks import document_chunk

    settings.INGEST_MAX_IN_FLIGHT = 1
    collection = factories.collection(team=team)
    broken, waiting = submit(collection, TEXT, title="Broken"), submit(collection, "Next.")
    ingestion_dispatch()

    document_chunk.on_failure(KeyError("a bug"), "task-id", (broken.pk,), {}, None)  # type: ignore[arg-type]

    broken.refresh_from_db()
    assert (broken.status, broken.error) == (
        "failed",
        "internal_error: the chunk stage failed (KeyError); re-ingest the document to try again",
    )
    assert sent == [(broken.pk, "parse"), (waiting.pk, "parse")]


def test_a_task_the_broker_refuses_puts_its_document_back_in_line(
    team: Team, queued: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = submit(factories.collection(team=team), "Short.")
    Document.objects.filter(pk=document.pk).update(dispatched_at=timezone.now())

    class Refused:
        def apply_async(self) -> None:
            raise ConnectionError("the broker is down")

    monkeypatch.setattr(celery_app, "signature", lambda *args, **kwargs: Refused())
    dispatch._publish(document.pk, "parse")  # logged, not raised into the upload

    assert Document.objects.get(pk=document.pk).dispatched_at is None  # the sweep sends it
