"""Deletes in Django admin go through the services the API uses: vectors leave the index
(its version moves), uploaded files and index folders leave the disk, ingestion holds are
settled, and the audit log says who deleted what. Chunks are never deleted alone.

Issue 27, item 9: the admin's deletes were ``Model.delete()`` and ``QuerySet.delete()``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.core.models import AuditEvent
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import collection_index_load, document_create_from_text, index_store
from apps.usage.budgets import budget_reserve
from apps.usage.models import Limit, Reservation, UsageRecord
from tests import factories

pytestmark = pytest.mark.django_db

Action = AuditEvent.Action


@pytest.fixture
def committed(django_capture_on_commit_callbacks: Any, admin_client: Client) -> Callable[..., Any]:
    """POST to the admin and run its on-commit work, as its commit would."""

    def post(path: str, data: dict[str, Any]) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            response = admin_client.post(path, data)
        assert response.status_code == 302, response.content.decode()[:2000]
        return response

    return post


def seeded(team: Team, name: str) -> tuple[Collection, Document]:
    collection = factories.collection(team=team, name=name)
    document = factories.file_document(
        collection=collection, name=f"{name}.txt", data=f"The {name} valve manual.".encode()
    )
    return collection, document


def found(api: APIClient, query: str) -> set[int]:
    response = api.post("/api/v1/search", {"query": query, "mode": "keyword"}, format="json")
    assert response.status_code == 200, response.content
    return {result["document_id"] for result in response.json()["results"]}


def audited() -> list[tuple[str, str, str, str]]:
    rows = AuditEvent.objects.filter(
        action__in=[Action.DOCUMENT_DELETED, Action.COLLECTION_DELETED]
    )
    return list(rows.order_by("pk").values_list("action", "actor", "team_name", "target"))


def test_a_document_deleted_in_the_admin_leaves_the_index_disk_and_log_as_the_api_would(
    team: Team,
    other_team: Team,
    api_as: Callable[..., APIClient],
    committed: Callable[..., Any],
) -> None:
    collection, document = seeded(team, "acme")
    _, theirs = seeded(other_team, "globex")
    source = Path(document.source.path)
    chunk_ids = set(Chunk.objects.filter(document=document).values_list("pk", flat=True))
    collection.refresh_from_db()
    version = collection.index_version
    ours, other = api_as(team), api_as(other_team)
    assert found(ours, "valve") == {document.pk}

    committed(f"/admin/knowledge/document/{document.pk}/delete/", {"post": "yes"})

    collection.refresh_from_db()
    assert collection.index_version == version + 1  # cached answers quoting it miss
    assert not chunk_ids & set(collection_index_load(collection).ids())
    assert found(ours, "valve") == set()
    assert not source.exists()
    assert audited() == [(Action.DOCUMENT_DELETED, "user admin", "acme", f"document {document.pk}")]
    # The other team's document, in its own collection, is untouched.
    assert found(other, "valve") == {theirs.pk}
    assert Path(Document.objects.get(pk=theirs.pk).source.path).exists()


def test_bulk_document_delete_settles_the_ingestion_hold_of_a_queued_one(
    team: Team, settings: Any, committed: Callable[..., Any]
) -> None:
    settings.RATE_LIMIT_REDIS_URL = ""
    Limit.objects.create(team=team, daily_tokens=1_000_000)
    collection, indexed = seeded(team, "acme")
    queued = document_create_from_text(
        collection=collection, title="Later", text="queued words " * 50, enqueue=False
    ).document
    # What the embed stage holds while it runs.
    queued.reservation = budget_reserve(
        team=team, api_key=None, tokens=500, kind=UsageRecord.Kind.EMBEDDING
    )
    queued.save()
    hold = queued.reservation.pk

    committed(
        "/admin/knowledge/document/",
        {"action": "delete_selected", "_selected_action": [indexed.pk, queued.pk], "post": "yes"},
    )

    assert not Document.objects.exists() and not Chunk.objects.exists()
    assert not Reservation.objects.filter(pk=hold, settled_at__isnull=True).exists()
    assert [row[0] for row in audited()] == [Action.DOCUMENT_DELETED, Action.DOCUMENT_DELETED]


def test_a_collection_deleted_in_the_admin_takes_its_index_folder_and_files(
    team: Team, other_team: Team, committed: Callable[..., Any]
) -> None:
    collection, document = seeded(team, "acme")
    spare, _ = seeded(team, "spare")
    other_collection, other_document = seeded(other_team, "globex")
    root = Path(index_store().root)
    source = Path(document.source.path)
    assert (root / collection.index_key).is_dir() and source.exists()

    committed(f"/admin/knowledge/collection/{collection.pk}/delete/", {"post": "yes"})
    committed(
        "/admin/knowledge/collection/",
        {"action": "delete_selected", "_selected_action": [spare.pk], "post": "yes"},
    )

    assert not (root / collection.index_key).exists() and not source.exists()
    assert not (root / spare.index_key).exists()
    assert audited() == [
        (Action.COLLECTION_DELETED, "user admin", "acme", f"collection {collection.pk} acme"),
        (Action.COLLECTION_DELETED, "user admin", "acme", f"collection {spare.pk} spare"),
    ]
    assert (root / other_collection.index_key).is_dir()
    assert Path(other_document.source.path).exists()


def test_a_chunk_is_never_deleted_alone(team: Team, admin_client: Client) -> None:
    _, document = seeded(team, "acme")
    chunk = Chunk.objects.filter(document=document).first()
    assert chunk is not None
    assert admin_client.get(f"/admin/knowledge/chunk/{chunk.pk}/delete/").status_code == 403
    changelist = admin_client.get("/admin/knowledge/chunk/")
    assert "delete_selected" not in changelist.content.decode()
    # Yet the document's own delete page is offered, chunks and all.
    page = admin_client.get(f"/admin/knowledge/document/{document.pk}/delete/")
    assert page.status_code == 200
    assert "Are you sure" in page.content.decode()
