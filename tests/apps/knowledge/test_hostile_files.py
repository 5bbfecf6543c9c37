"""Hostile files (tests/hostile_files.py) from one team: each fails alone, with its reason,
and at once, so that another team's document goes on; the web process never parses one.

Through the API (tasks run eagerly in this process, parsing in its bounded child), through
the dispatcher with one place at the workers, and through a real Celery worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pypdf
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.knowledge.models import Collection, Document
from apps.knowledge.services import dispatch, document_create_from_file
from apps.knowledge.services.dispatch import ingestion_dispatch
from apps.knowledge.services.ingestion import ingestion_stage_run
from apps.usage.models import Reservation, UsageRecord
from config.celery import app as celery_app
from tests import factories, hostile_files
from tests.apps.knowledge.conftest import Worker, wait_for

pytestmark = pytest.mark.django_db

FAILS_WITH = {
    "deeply-nested.pdf": "unsupported_document: not a readable PDF: its objects are nested "
    "too deeply",
    "page-tree-bomb.pdf": "too_many_pages: the PDF has 1000000000 pages; the limit is 2000",
    "stream-bomb.pdf": "unsupported_document: not a readable PDF: Limit reached while "
    "decompressing",
    "one-tag-5mb.html": "too_many_elements: the HTML has more than 200000 elements",
}
"""What each hostile file that must fail starts its error with (default limits)."""
READ = {"broken-xref.pdf", "deeply-nested.html"}
"""Hostile in form, yet within every limit: pypdf rebuilds the table; the tree is legal."""


@pytest.fixture(scope="module")
def corpus() -> dict[str, bytes]:
    return {name: build() for name, build in hostile_files.HOSTILE.items()}


@pytest.fixture
def no_pdf_here(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fail the test if this process (the web process, in these tests) opens a PDF."""
    opened: list[int] = []

    def refuse(self: pypdf.PdfReader, *args: object, **kwargs: object) -> None:
        opened.append(1)
        raise AssertionError("the web process opened a PDF")

    monkeypatch.setattr(pypdf.PdfReader, "__init__", refuse)
    return opened


def test_every_file_in_the_corpus_is_either_failed_or_read() -> None:
    assert set(hostile_files.HOSTILE) == set(FAILS_WITH) | READ


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", sorted(FAILS_WITH))
def test_a_hostile_upload_is_accepted_then_fails_with_its_reason(
    name: str, corpus: dict[str, bytes], api: APIClient, no_pdf_here: list[int]
) -> None:
    collection = api.post("/api/v1/collections", {"name": "docs"}, format="json").json()
    response = api.post(
        f"/api/v1/collections/{collection['id']}/documents",
        {"file": SimpleUploadedFile(name, corpus[name])},
        format="multipart",
    )
    assert response.status_code == 202, response.content
    document = api.get(f"/api/v1/documents/{response.json()['id']}").json()
    assert (document["status"], document["chunk_count"]) == ("failed", 0)
    assert document["error"].startswith(FAILS_WITH[name])
    assert no_pdf_here == []
    assert not UsageRecord.objects.exists()
    assert not Reservation.objects.filter(settled_at__isnull=True).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", sorted(READ))
def test_a_hostile_file_within_every_limit_is_indexed(
    name: str, corpus: dict[str, bytes], api: APIClient
) -> None:
    collection = api.post("/api/v1/collections", {"name": "docs"}, format="json").json()
    response = api.post(
        f"/api/v1/collections/{collection['id']}/documents",
        {"file": SimpleUploadedFile(name, corpus[name])},
        format="multipart",
    )
    document = api.get(f"/api/v1/documents/{response.json()['id']}").json()
    assert (document["status"], document["error"]) == ("indexed", "")


# -- the dispatcher: a hostile file's place with the workers is free the moment it fails --


@pytest.fixture
def one_place(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, str]]]:
    """Tasks go through a broker (not run eagerly), one document at the workers at a time;
    yields what would go to the broker, in order: (document id, stage)."""
    settings.INGEST_MAX_IN_FLIGHT = 1
    calls: list[tuple[int, str]] = []
    monkeypatch.setattr(dispatch, "_send", lambda pk, stage: calls.append((pk, stage)))
    saved, celery_app.conf.task_always_eager = celery_app.conf.task_always_eager, False
    try:
        yield calls
    finally:
        celery_app.conf.task_always_eager = saved


def upload(collection: Collection, name: str, data: bytes) -> Document:
    document = document_create_from_file(
        collection=collection, upload=SimpleUploadedFile(name, data), enqueue=False
    ).document
    dispatch.ingestion_enqueue(document=document)
    return document


@pytest.mark.parametrize("name", sorted(FAILS_WITH))
def test_a_failing_hostile_file_hands_its_place_to_another_team_at_once(
    name: str,
    corpus: dict[str, bytes],
    team: Team,
    other_team: Team,
    one_place: list[tuple[int, str]],
    no_pdf_here: list[int],
) -> None:
    hostile = upload(factories.collection(team=team), name, corpus[name])
    ordinary = upload(
        factories.collection(team=other_team), "notes.txt", b"The pantry key hangs by the door."
    )
    assert ingestion_dispatch() == [hostile.pk]  # the one place
    ingestion_stage_run(document_id=hostile.pk, stage="parse")  # returns: no exception
    hostile.refresh_from_db()
    assert hostile.status == "failed" and hostile.error.startswith(FAILS_WITH[name])
    assert hostile.lost_deliveries == 0  # a failure, not a lost delivery
    # Its place went to the other team's document in the same delivery, not at a sweep.
    assert one_place == [(hostile.pk, "parse"), (ordinary.pk, "parse")]
    assert no_pdf_here == []


# -- a real worker: one team's whole corpus, another team's document --------------------------


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_fails_every_hostile_file_and_indexes_another_teams_document(
    start_worker: Callable[..., Worker],
    corpus: dict[str, bytes],
    team: Team,
    other_team: Team,
    settings: Any,
) -> None:
    """One place at the workers, taken first by the hostile files: the other team's
    document is indexed only if each of them gives its place back when it fails (it may
    then overtake those still waiting: their team has used the workers more)."""
    settings.INGEST_MAX_IN_FLIGHT = 1  # this process dispatches each upload on commit
    worker = start_worker(INGEST_MAX_IN_FLIGHT="1")
    attacker = factories.collection(team=team)
    hostile = {
        name: document_create_from_file(
            collection=attacker, upload=SimpleUploadedFile(name, corpus[name])
        ).document
        for name in FAILS_WITH
    }
    ordinary = document_create_from_file(
        collection=factories.collection(team=other_team),
        upload=SimpleUploadedFile("paper.pdf", hostile_files.ordinary_pdf()),
    ).document
    assert all(d.status == "queued" for d in [*hostile.values(), ordinary])
    wait_for(
        lambda: Document.objects.get(pk=ordinary.pk).status in ("indexed", "failed"),
        worker=worker,
        timeout=120,
        what="the other team's document",
    )
    ordinary.refresh_from_db()
    assert (ordinary.status, ordinary.error, ordinary.page_count) == ("indexed", "", 1)
    wait_for(
        lambda: not Document.objects.filter(status__in=("queued", "processing")).exists(),
        worker=worker,
        timeout=120,
        what="the hostile files",
    )
    for name, document in hostile.items():
        document.refresh_from_db()
        assert document.status == "failed", (name, document.status, worker.output())
        assert document.error.startswith(FAILS_WITH[name]), (name, document.error)
        assert document.indexed_at is None and document.lost_deliveries == 0
    assert worker.alive()
