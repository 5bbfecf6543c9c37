"""The engine backend (Milvus Lite in this process): writes that follow the database
transaction, drift found and mended, isolation inside and after the engine, moves between
backends while searches go on, and the system check (fake embedder)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from io import StringIO
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.knowledge.backends import milvus as milvus_backend
from apps.knowledge.backends.milvus import engine, scope
from apps.knowledge.models import Chunk, Collection
from apps.knowledge.services import (
    collection_delete,
    collection_index_rebuild,
    document_delete,
    document_ingest,
    document_reingest,
    index_store,
)
from retrieval.milvus import MilvusRows, Scope
from tests import factories
from tests.apps.knowledge.searching import MODES, Answers
from tests.apps.knowledge.searching import answers as search_answers

QUERIES = ["gearbox GBX-4410", "drive belt", "pump seal", "valve"]


@pytest.fixture
def committed(django_capture_on_commit_callbacks: Any) -> Callable[..., Any]:
    """Call a service and run its on-commit work, as its commit would outside the test's
    transaction (the engine deletes once a delete commits)."""

    def call(service: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            return service(*args, **kwargs)

    return call


def answers(api: APIClient, collection: Collection, modes: Sequence[str] = MODES) -> Answers:
    return search_answers(api, collection, QUERIES, modes=modes, digits=4)


def stray(pk: int, where: Scope, text: str) -> MilvusRows:
    """One engine row the database never had."""
    return MilvusRows(
        ids=np.array([pk], dtype=np.int64),
        vectors=np.ones((1, 384), dtype=np.float32) / np.sqrt(384),
        texts=[text],
        scope=where,
        documents=[0],
    )


def live_chunks(collection: Collection) -> set[int]:
    indexed = Chunk.objects.filter(collection=collection, document__status="indexed")
    return set(indexed.values_list("pk", flat=True))


def held(collection: Collection) -> set[int]:
    return set(engine().ids(scope(collection)).tolist())


def manual(collection: Collection, number: int) -> Any:
    topics = ["gearbox GBX-4410", "drive belt DBT-9921", "pump seal", "valve body"]
    topic = topics[number % len(topics)]
    text = "\n\n".join(
        f"## Section {s}\n\nThe {topic} manual, part {number}.{s}: torque and wear of the "
        f"{topic} in unit {number * 10 + s}."
        for s in range(3)
    )
    return factories.document(collection=collection, title=f"Manual {number}", text=text)


@pytest.mark.django_db
@pytest.mark.usefixtures("milvus")
def test_writes_follow_the_database_and_answer_as_a_full_rebuild(
    api: APIClient, team: Team, committed: Callable[..., Any]
) -> None:
    collection = factories.collection(team=team, name="manuals")
    assert collection.index_backend == "milvus"
    documents = [manual(collection, number) for number in range(6)]
    committed(document_delete, document=documents[1])
    reingested = committed(document_reingest, document=documents[2])
    document_ingest(document_id=reingested.pk)  # a re-delivery adds nothing twice
    document_ingest(document_id=documents[3].pk)
    collection.refresh_from_db()
    assert collection.index_base == collection.index_version  # the engine keeps no deltas
    assert held(collection) == live_chunks(collection)
    incremental = answers(api, collection)
    assert all(incremental[mode][0] for mode in MODES)

    rebuilt = committed(collection_index_rebuild, collection_id=collection.pk)
    assert rebuilt.index_version == collection.index_version + 1
    assert answers(api, rebuilt) == incremental
    out = StringIO()
    call_command("index_check", stdout=out)
    assert f"ok     acme/manuals: {len(live_chunks(collection))} vectors" in out.getvalue()
    assert not index_store().root.exists() or not any(index_store().root.iterdir())


@pytest.mark.django_db
@pytest.mark.usefixtures("milvus")
def test_a_rolled_back_write_changes_nothing_a_search_returns(
    api: APIClient, team: Team, committed: Callable[..., Any]
) -> None:
    collection = factories.collection(team=team, name="crash")
    gear = factories.document(collection=collection, title="Gear", text="Part GBX-4410.")
    gear_id, before = gear.pk, live_chunks(collection)

    class Crash(Exception):
        pass

    # A delete that never commits takes nothing out of the engine.
    with pytest.raises(Crash), transaction.atomic():
        document_delete(document=gear)
        raise Crash
    assert held(collection) == before
    hits = api.post("/api/v1/search", {"query": "GBX-4410", "mode": "keyword"}, format="json")
    assert [r["document_id"] for r in hits.json()["results"]] == [gear_id]

    # An add that never commits leaves engine rows no search returns, and index_check
    # finds them.
    belt = factories.document(collection=collection, title="Belt", text="Part DBT-9921.")
    chunk = Chunk.objects.get(document=belt)
    with pytest.raises(Crash), transaction.atomic():
        belt.status = "processing"
        belt.save(update_fields=["status"])
        raise Crash
    belt.status = "processing"  # as a failed index stage leaves it, after its upsert
    belt.save(update_fields=["status"])
    assert chunk.pk in held(collection)
    for mode in MODES:
        found = api.post("/api/v1/search", {"query": "DBT-9921", "mode": mode}, format="json")
        assert belt.pk not in [r["document_id"] for r in found.json()["results"]]
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("index_check", stdout=out)
    assert "vector index 2 (missing 0, extra 1)" in out.getvalue()
    committed(call_command, "index_check", "--repair", stdout=StringIO())
    assert held(collection) == live_chunks(collection) == before
    call_command("index_check", stdout=StringIO())


@pytest.mark.django_db
@pytest.mark.usefixtures("milvus")
def test_index_check_mends_missing_stray_and_orphaned_engine_rows(
    team: Team, other_team: Team, committed: Callable[..., Any]
) -> None:
    collection = factories.collection(team=team, name="checked")
    factories.document(collection=collection, title="Gear", text="The gearbox GBX-4410.")
    factories.document(collection=collection, title="Belt", text="The belt DBT-9921.")
    theirs = factories.collection(team=other_team, name="theirs")
    factories.document(collection=theirs, title="Pump", text="The pump seal.")
    (lost, *_) = sorted(live_chunks(collection))
    engine().delete([lost])  # the engine lost a row
    engine().upsert(stray(10**9, scope(collection), "stray"))  # one the database never had
    gone = Scope(team=team.pk, collection=10**6)  # a deleted collection the engine kept
    engine().upsert(stray(10**9 + 1, gone, "orphan"))
    out = StringIO()
    with pytest.raises(CommandError, match="2 collection"):
        call_command("index_check", stdout=out)
    assert "acme/checked: vector index 2 (missing 1, extra 1)" in out.getvalue()
    assert "DRIFT  milvus: found 1 of deleted collections" in out.getvalue()
    assert "ok     " in out.getvalue()  # the other team's collection, untouched

    out = StringIO()
    committed(call_command, "index_check", "--repair", stdout=out)
    assert "rebuilt from 2 stored chunks" in out.getvalue()
    assert held(collection) == live_chunks(collection)
    assert held(theirs) == live_chunks(theirs)
    assert not len(engine().ids(gone))
    call_command("index_check", stdout=StringIO())


@pytest.mark.django_db
@pytest.mark.usefixtures("milvus")
def test_the_product_checks_each_engine_hit_for_the_team(
    api: APIClient, team: Team, other_team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = factories.collection(team=team, name="mine")
    own = factories.document(collection=mine, title="Gear", text="Gearbox GBX-4410 torque.")
    theirs = factories.collection(team=other_team, name="theirs")
    secret = factories.document(collection=theirs, title="Gear", text="Gearbox GBX-4410 secret.")
    for mode in MODES:
        body = {"query": "gearbox GBX-4410", "mode": mode}
        found = api.post("/api/v1/search", body, format="json").json()["results"]
        assert [r["document_id"] for r in found] == [own.pk]
    # An engine filter gone wrong (every partition, every team) still leaks nothing.
    monkeypatch.setattr("retrieval.milvus.search_filter", lambda where: "id >= 0")
    for mode in MODES:
        body = {"query": "gearbox GBX-4410", "mode": mode}
        found = api.post("/api/v1/search", body, format="json").json()["results"]
        assert secret.pk not in [r["document_id"] for r in found] and found


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("milvus")
def test_deleting_a_collection_drops_its_partition_and_nothing_of_another_team(
    api: APIClient, team: Team, other_team: Team
) -> None:
    mine = factories.collection(team=team, name="mine")
    factories.document(collection=mine, title="Gear", text="Gearbox GBX-4410.")
    theirs = factories.collection(team=other_team, name="theirs")
    factories.document(collection=theirs, title="Gear", text="Gearbox GBX-4410.")
    kept, dropped = held(mine), scope(theirs)
    collection_delete(collection=theirs)
    assert not len(engine().ids(dropped)) and held(mine) == kept
    found = api.post("/api/v1/search", {"query": "GBX-4410"}, format="json").json()["results"]
    assert len(found) == 1


@pytest.mark.django_db(transaction=True)
def test_reindex_moves_collections_both_ways_while_searches_go_on(
    api: APIClient, team: Team, other_team: Team, settings: Any, milvus_lite: str
) -> None:
    settings.MILVUS_URI = milvus_lite
    library = factories.collection(team=team, name="library")
    for number in range(4):
        manual(library, number)
    theirs = factories.collection(team=other_team, name="theirs")
    manual(theirs, 9)
    assert library.index_backend == "faiss"
    on_faiss = answers(api, library)

    # The move holds the collection's row while the engine fills: a search meanwhile
    # answers from FAISS, then the row moves and the next search reads the engine.
    filling, release = threading.Event(), threading.Event()
    upsert = milvus_backend._upsert

    def slow_upsert(collection: Collection, **kwargs: Any) -> None:
        upsert(collection, **kwargs)
        if collection.pk == library.pk:
            filling.set()
            assert release.wait(30)

    settings_backend = "milvus"
    try:
        milvus_backend._upsert = slow_upsert  # type: ignore[assignment]
        out = StringIO()
        failures: list[BaseException] = []

        def move() -> None:
            try:
                call_command("reindex", "--to", settings_backend, "--grace", "0", stdout=out)
            except BaseException as exc:
                failures.append(exc)
                filling.set()
                raise

        mover = threading.Thread(target=move)
        mover.start()
        assert filling.wait(30) and not failures, failures
        # SQLite has one writer: a search that records its query's usage waits for the
        # move's transaction there, so only keyword search (which records nothing) runs
        # alongside it; PostgreSQL runs every mode.
        modes = MODES if connection.vendor == "postgresql" else ("keyword",)
        during = answers(api, library, modes)
        release.set()
        mover.join(60)
        assert not mover.is_alive() and not failures, failures
    finally:
        milvus_backend._upsert = upsert  # type: ignore[assignment]
    assert during == {mode: on_faiss[mode] for mode in modes}
    assert "2 collection(s) on milvus; old indexes dropped" in out.getvalue()
    library.refresh_from_db()
    assert library.index_backend == "milvus" and held(library) == live_chunks(library)
    assert not (index_store().root / library.index_key).exists()
    on_milvus = answers(api, library)
    assert on_milvus["dense"] == on_faiss["dense"]  # the same vectors, the same cosine
    # BM25 by another implementation: the same best chunk, its own scores.
    assert [hits[0][0] for hits in on_milvus["keyword"]] == [
        hits[0][0] for hits in on_faiss["keyword"]
    ]

    call_command("reindex", "--to", "faiss", "--grace", "0", stdout=StringIO())
    library.refresh_from_db()
    assert library.index_backend == "faiss" and not held(library)
    back = answers(api, library)
    for mode in MODES:
        assert back[mode] == on_faiss[mode], mode
    call_command("index_check", stdout=StringIO())
    engine().drop()


def test_the_system_check_names_an_unknown_backend_or_engine_index(settings: Any) -> None:
    from apps.knowledge.checks import search_settings_check

    settings.VECTOR_BACKEND = "qdrant"
    (error,) = search_settings_check()
    assert error.id == "knowledge.E002" and "VECTOR_BACKEND" in error.msg
    settings.VECTOR_BACKEND, settings.MILVUS_INDEX = "milvus", "DISKANN"
    (error,) = search_settings_check()
    assert "MILVUS_INDEX" in error.msg


@pytest.mark.django_db
@pytest.mark.usefixtures("milvus")
def test_an_unreachable_engine_is_503_and_charges_nothing(
    api: APIClient, team: Team, settings: Any
) -> None:
    from apps.usage.models import Limit, Reservation, UsageRecord

    collection = factories.collection(team=team, name="down")
    factories.document(collection=collection, title="Gear", text="Gearbox GBX-4410.")
    Limit.objects.create(team=team, daily_tokens=10_000)
    queries = UsageRecord.objects.filter(operation="query").count()
    settings.MILVUS_URI = "http://127.0.0.1:1"  # nothing listens there
    for mode in MODES:
        response = api.post("/api/v1/search", {"query": "GBX-4410", "mode": mode}, format="json")
        assert response.status_code == 503, response.content
        assert response.json()["error"]["code"] == "index_unavailable"
        assert response["Retry-After"] == "2"
    assert UsageRecord.objects.filter(operation="query").count() == queries
    assert not Reservation.objects.filter(settled_at__isnull=True).exists()
