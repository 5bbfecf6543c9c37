"""One ingestion end to end through a real Celery worker process over a real Redis broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.knowledge.models import Document
from apps.usage.models import UsageRecord
from tests.apps.knowledge.conftest import Worker, wait_for
from tests.conftest import REAL_EMBEDDER

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_real_worker_ingests_an_upload(
    start_worker: Callable[..., Worker], api: APIClient, settings: Any, real_embedder: None
) -> None:
    worker = start_worker(EMBEDDER_BACKEND=REAL_EMBEDDER)
    created = api.post("/api/v1/collections", {"name": "handbook"}, format="json").json()
    response = api.post(
        f"/api/v1/collections/{created['id']}/documents",
        {"title": "Kitchen", "text": "The spare key to the pantry hangs behind the blue door."},
        format="json",
    )
    assert (response.status_code, response.json()["status"]) == (202, "queued")
    document_id = response.json()["id"]
    wait_for(
        lambda: Document.objects.get(pk=document_id).status in ("indexed", "failed"),
        worker=worker,
        timeout=180,
        what="the document",
    )
    document = Document.objects.get(pk=document_id)
    assert document.status == "indexed", f"{document.error!r}\n{worker.output()}"
    assert document.chunk_count == 1 and document.progress == 100
    usage = UsageRecord.objects.get(operation="ingest", object_id=str(document_id))
    assert usage.prompt_tokens == document.embedding_tokens > 0
    hit = api.post("/api/v1/search", {"query": "where is the pantry key?"}, format="json")
    assert hit.json()["results"][0]["document_id"] == document_id
