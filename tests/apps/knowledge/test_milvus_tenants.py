"""The engine backend as another team sees it: what an engine outage, a filter that names
a great many chunks, or a deep read does to a team's ingestion and search (Milvus Lite in
this process, fake embedder)."""

from __future__ import annotations

from typing import Any

import pytest
from pymilvus import MilvusException
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.knowledge.backends.milvus import engine
from apps.knowledge.backends.milvus import scope as scope_of
from apps.knowledge.models import Chunk, Document
from apps.knowledge.services import document_create_from_text
from apps.knowledge.services.stages import STAGE_FUNCTIONS, STAGES
from apps.knowledge.tasks import TRANSIENT
from tests import factories


def unreachable(*args: Any, **kwargs: Any) -> None:
    """What pymilvus raises when the engine is down or restarting."""
    raise MilvusException(code=2, message="Fail connecting to server on 127.0.0.1:19530")


@pytest.mark.django_db
@pytest.mark.usefixtures("milvus")
def test_an_engine_outage_while_indexing_is_retried_not_a_failed_document(
    api: APIClient, team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    collection = factories.collection(team=team, name="manuals")
    engine().ensure()
    document = document_create_from_text(
        collection=collection, title="Gear", text="The gearbox GBX-4410.", enqueue=False
    ).document
    *before, index = STAGES
    for stage in before:
        STAGE_FUNCTIONS[stage](document_id=document.pk)
    with monkeypatch.context() as patched:
        patched.setattr(engine().client, "upsert", unreachable)
        # The stage's task retries what TRANSIENT names; anything else fails the document
        # for good ("re-ingest the document to try again"), every team's at once.
        with pytest.raises(TRANSIENT):
            STAGE_FUNCTIONS[index](document_id=document.pk)
    document.refresh_from_db()
    assert document.status != Document.Status.FAILED
    STAGE_FUNCTIONS[index](document_id=document.pk)  # the retry, the engine back
    document.refresh_from_db()
    assert document.status == Document.Status.INDEXED
    found = api.post("/api/v1/search", {"query": "GBX-4410", "mode": "keyword"}, format="json")
    assert [r["document_id"] for r in found.json()["results"]] == [document.pk]


@pytest.mark.django_db
@pytest.mark.usefixtures("milvus")
def test_an_engine_outage_during_search_answers_503_with_retry_after(
    api: APIClient, team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    collection = factories.collection(team=team, name="manuals")
    factories.document(collection=collection, title="Gear", text="The gearbox GBX-4410.")
    monkeypatch.setattr(engine().client, "search", unreachable)
    for mode in ("hybrid", "dense", "keyword"):
        response = api.post("/api/v1/search", {"query": "GBX-4410", "mode": mode}, format="json")
        assert response.status_code == 503, (mode, response.content)
        assert response.json()["error"]["code"] == "index_unavailable"
        assert int(response["Retry-After"]) > 0


@pytest.mark.django_db
@pytest.mark.usefixtures("milvus")
def test_a_fusion_depth_past_the_engine_top_k_is_read_as_deep_as_the_engine_allows(
    api: APIClient, team: Team, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Milvus refuses a limit (and an HNSW ef) past 16384; Milvus Lite does not, so the
    test reads what the engine was asked."""
    settings.SEARCH_FUSION_DEPTH = 20_000
    collection = factories.collection(team=team, name="manuals")
    gear = factories.document(collection=collection, title="Gear", text="The gearbox GBX-4410.")
    asked: list[tuple[int, Any]] = []
    search = engine().client.search

    def recorded(*args: Any, **kwargs: Any) -> Any:
        asked.append((kwargs["limit"], kwargs["search_params"].get("params", {}).get("ef")))
        return search(*args, **kwargs)

    monkeypatch.setattr(engine().client, "search", recorded)
    response = api.post("/api/v1/search", {"query": "gearbox GBX-4410"}, format="json")
    assert response.status_code == 200, response.content
    assert [r["document_id"] for r in response.json()["results"]] == [gear.pk]
    assert asked and all(limit <= 16_384 and (ef or 0) <= 16_384 for limit, ef in asked)


@pytest.mark.django_db
@pytest.mark.usefixtures("milvus")
def test_a_filter_over_many_chunks_reaches_the_engine_as_its_few_documents(
    api: APIClient, team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    import retrieval.milvus

    collection = factories.collection(team=team, name="long")
    text = "\n\n".join(
        f"## Part {n}\n\nThe gearbox GBX-4410, section {n}. " * 30 for n in range(40)
    )
    long = factories.document(collection=collection, title="Manual", text=text)
    factories.document(collection=collection, title="Other", text="The gearbox GBX-4410.")
    chunks = Chunk.objects.filter(document=long).count()
    assert chunks > 20
    sent: list[str] = []
    real = retrieval.milvus.search_filter
    monkeypatch.setattr(
        "retrieval.milvus.search_filter", lambda where: sent.append(real(where)) or sent[-1]
    )
    body = {"query": "gearbox GBX-4410", "filters": {"titles": ["Manual"]}, "top_k": 50}
    found = api.post("/api/v1/search", body, format="json").json()["results"]
    assert found and {r["document_id"] for r in found} == {long.pk}
    # One document id per leg, not the document's every chunk id.
    assert len(sent) == 2 and all(f"document in [{long.pk}]" in s for s in sent), sent
    assert all(" id in " not in s for s in sent)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("milvus")
def test_engine_rows_outliving_their_chunks_never_leave_a_search_short(
    api: APIClient, team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.knowledge.services import document_delete

    collection = factories.collection(team=team, name="stale")
    gone = [
        factories.document(collection=collection, title=f"Old {n}", text=f"Gearbox GBX-4410 {n}.")
        for n in range(3)
    ]
    live = factories.document(collection=collection, title="New", text="Gearbox GBX-4410 too.")
    with monkeypatch.context() as patched:
        patched.setattr(engine(), "delete", unreachable)  # the engine misses the deletes
        for document in gone:
            document_delete(document=document)
    assert len(engine().ids(scope_of(collection))) == 4  # three stale rows, one live
    for mode in ("hybrid", "dense", "keyword"):
        body = {"query": "gearbox GBX-4410", "mode": mode, "top_k": 1}
        found = api.post("/api/v1/search", body, format="json").json()["results"]
        assert [r["document_id"] for r in found] == [live.pk], mode
