"""Search modes, metadata filters and the keyword index beside the vector index (fake
embedder, real FAISS and bm25s)."""

from collections.abc import Callable
from io import StringIO
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.knowledge.backends.faiss import index_state
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import (
    collection_index_rebuild,
    document_delete,
    document_ingest,
    document_reingest,
    index_store,
)
from apps.knowledge.services.indexing import collection_index_append
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord
from retrieval import FusionPolicy, Hit, fuse
from tests import factories
from tests.apps.accounts.test_auth import error_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("index_backend")]

MODES = ["hybrid", "dense", "keyword"]


def search(api: APIClient, **body: object) -> list[dict[str, object]]:
    response = api.post("/api/v1/search", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["results"]  # type: ignore[no-any-return]


def keyword_ids(collection: Collection) -> set[int]:
    """The chunk ids the live keyword postings hold, read from disk (the engine: its rows,
    each holding a chunk's vector and terms)."""
    collection.refresh_from_db()
    if collection.index_backend == "milvus":
        return milvus_ids(collection)
    index = index_store().read_state(collection.index_key, index_state(collection))
    held = [
        ids[~np.isin(ids, dead)]
        for ids, dead in (
            (s.keywords.ids(), d) for s, d in zip(index.segments, index.dead, strict=True)
        )
    ]
    return set(np.concatenate(held).tolist())


def vector_ids(collection: Collection) -> set[int]:
    collection.refresh_from_db()
    if collection.index_backend == "milvus":
        return milvus_ids(collection)
    index = index_store().read_state(collection.index_key, index_state(collection))
    return set(index.ids().tolist())


def milvus_ids(collection: Collection) -> set[int]:
    from apps.knowledge.backends.milvus import engine, scope

    return set(engine().ids(scope(collection)).tolist())


def chunk_ids(collection: Collection) -> set[int]:
    return set(
        Chunk.objects.filter(collection=collection, document__status="indexed").values_list(
            "pk", flat=True
        )
    )


@pytest.fixture
def library(team: Team) -> Collection:
    collection = factories.collection(team=team, name="library")
    factories.document(
        collection=collection, title="Fans", text="Replacement fans ship as XQ-7781-B."
    )
    factories.document(collection=collection, title="Soup", text="The cafeteria serves soup.")
    return collection


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_finds_by_its_own_means(api: APIClient, library: Collection, mode: str) -> None:
    results = search(api, query="XQ-7781-B fans", mode=mode, top_k=2)
    assert results[0]["title"] == "Fans"
    if mode == "keyword":  # only chunks holding a query term, scored by BM25
        assert [r["title"] for r in results] == ["Fans"]
    if mode == "hybrid":  # z-scores (the default), alpha 0.6: top of dense, keyword's only
        assert results[0]["score"] == pytest.approx(0.6 * 1 + 0.4 * 1)


def test_the_default_mode_is_hybrid_fused_by_z_scores(api: APIClient, library: Collection) -> None:
    default = search(api, query="cafeteria soup")
    assert default == search(api, query="cafeteria soup", mode="hybrid")
    # Dense z-scores 1 and -1; the one keyword hit 1, the missing at 0; alpha 0.6 (one
    # chunk per document: fusing by document changes nothing here).
    assert [r["score"] for r in default] == [pytest.approx(1.0), pytest.approx(-0.6)]


def test_keyword_mode_charges_nothing_and_dense_modes_charge_the_query(
    api: APIClient, team: Team, library: Collection
) -> None:
    Limit.objects.create(team=team, daily_tokens=1_000)
    before = UsageRecord.objects.filter(operation="query").count()
    assert search(api, query="cafeteria soup", mode="keyword")
    assert UsageRecord.objects.filter(operation="query").count() == before
    assert not QuotaCounter.objects.exists() or QuotaCounter.objects.get().used == 0
    for mode in ("dense", "hybrid"):
        search(api, query="cafeteria soup", mode=mode)
    records = UsageRecord.objects.filter(operation="query")
    assert records.count() == before + 2
    assert QuotaCounter.objects.get().used == sum(r.total_tokens for r in records)
    assert not Reservation.objects.filter(settled_at__isnull=True).exists()


def test_keyword_mode_needs_no_room_in_the_quota(
    api: APIClient, team: Team, library: Collection, monkeypatch: pytest.MonkeyPatch
) -> None:
    Limit.objects.create(team=team, daily_tokens=1)
    from apps.knowledge.services import embedder

    monkeypatch.setattr(embedder(), "embed", lambda texts: pytest.fail("embedded"))
    assert search(api, query="soup", mode="keyword")[0]["title"] == "Soup"
    response = api.post("/api/v1/search", {"query": "soup", "mode": "dense"}, format="json")
    assert (response.status_code, error_of(response)["code"]) == (429, "team_quota_exceeded")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"mode": "fuzzy"}, "mode"),
        ({"mode": None}, "mode"),
        ({"filters": {"document_id": [1]}}, "filters.document_id"),
        ({"filters": {"document_ids": []}}, "filters.document_ids"),
        ({"filters": {"document_ids": [0]}}, "filters.document_ids.0"),
        ({"filters": {"titles": "Fans"}}, "filters.titles"),
        ({"filters": []}, "filters"),
    ],
)
def test_bad_modes_and_filters_are_400_invalid_value(
    api: APIClient, body: dict[str, object], param: str
) -> None:
    response = api.post("/api/v1/search", {"query": "x", **body}, format="json")
    assert response.status_code == 400
    error = error_of(response)
    assert (error["code"], error["param"]) == ("invalid_value", param)


@pytest.mark.parametrize("mode", MODES)
def test_filters_apply_inside_the_search_not_after_the_top_k(
    api: APIClient, team: Team, mode: str
) -> None:
    collection = factories.collection(team=team, name="many")
    for i in range(12):
        factories.document(
            collection=collection, title=f"Pump {i}", text=f"Pump {i} pressure valve manual."
        )
    target = factories.document(
        collection=collection, title="Valve", text="The pressure valve of pump 12, briefly."
    )
    unfiltered = search(api, query="pump pressure valve manual", mode=mode, top_k=1)
    assert unfiltered[0]["document_id"] != target.pk
    by_id = search(
        api,
        query="pump pressure valve manual",
        mode=mode,
        top_k=1,
        filters={"document_ids": [target.pk]},
    )
    assert [r["document_id"] for r in by_id] == [target.pk]
    by_title = search(
        api, query="pump pressure valve", mode=mode, top_k=5, filters={"titles": ["Valve"]}
    )
    assert [r["title"] for r in by_title] == ["Valve"]
    both = search(
        api,
        query="pump pressure valve",
        mode=mode,
        filters={"document_ids": [target.pk], "titles": ["Pump 3"]},
    )
    assert both == []  # every filter given must hold


@pytest.mark.parametrize("mode", MODES)
def test_filters_never_leak_another_teams_chunk(
    api: APIClient, other_team: Team, api_as: Callable[..., APIClient], team: Team, mode: str
) -> None:
    theirs = factories.collection(team=other_team, name="vault")
    secret = factories.document(
        collection=theirs, title="Vault", text="The vault combination is 4-8-15-16-23-42."
    )
    own = factories.collection(team=team, name="own")
    factories.document(collection=own, title="Vault", text="Our vault holds the old menus.")
    for filters in (
        {"document_ids": [secret.pk]},
        {"titles": ["Vault"]},
        {"document_ids": [secret.pk], "titles": ["Vault"]},
    ):
        results = search(api, query="vault combination", mode=mode, top_k=50, filters=filters)
        assert all(r["collection_id"] == own.pk for r in results), filters
        assert secret.pk not in {r["document_id"] for r in results}
    # The owner finds it with the same filter.
    mine = api_as(other_team).post(
        "/api/v1/search",
        {"query": "vault combination", "mode": mode, "filters": {"document_ids": [secret.pk]}},
        format="json",
    )
    assert [r["document_id"] for r in mine.json()["results"]] == [secret.pk]


def test_keyword_index_follows_ingest_delete_and_reingest(
    api: APIClient, team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    collection = factories.collection(team=team, name="changing")
    first = factories.document(
        collection=collection, title="Gear", text="The gearbox part is GBX-4410."
    )
    second = factories.document(
        collection=collection, title="Belt", text="The drive belt part is DBT-9921."
    )
    assert keyword_ids(collection) == vector_ids(collection) == chunk_ids(collection)
    assert search(api, query="GBX-4410", mode="keyword")[0]["document_id"] == first.pk

    with django_capture_on_commit_callbacks(execute=True):  # the engine deletes on commit
        document_delete(document=first)
    assert keyword_ids(collection) == vector_ids(collection) == chunk_ids(collection)
    assert search(api, query="GBX-4410", mode="keyword") == []

    old = chunk_ids(collection)
    with django_capture_on_commit_callbacks(execute=True):  # ingested again once committed
        reingesting = document_reingest(document=second)
    document_ingest(document_id=reingesting.pk)  # a re-delivery adds nothing twice
    assert keyword_ids(collection) == vector_ids(collection) == chunk_ids(collection)
    assert not keyword_ids(collection) & old
    assert search(api, query="DBT-9921", mode="keyword")[0]["document_id"] == second.pk


@pytest.mark.faiss_only
def test_a_rolled_back_write_leaves_both_indexes_at_the_committed_version(
    api: APIClient, team: Team
) -> None:
    collection = factories.collection(team=team, name="crash")
    document = factories.document(collection=collection, title="Gear", text="Part GBX-4410.")
    collection.refresh_from_db()
    committed = collection.index_version

    class Crash(Exception):
        pass

    with pytest.raises(Crash), transaction.atomic():
        every = np.array(sorted(chunk_ids(collection)), dtype=np.int64)
        collection_index_append(
            collection_id=collection.pk,
            ids=every[:0],
            vectors=np.zeros((0, 384), dtype=np.float32),
            tombstones=every,
        )
        raise Crash  # the process dies before the commit: files written, row not moved
    collection.refresh_from_db()
    assert collection.index_version == committed
    orphan = index_store().delta_path(collection.index_key, committed + 1)
    assert orphan.is_dir()  # written, never published: searches ignore it
    assert search(api, query="GBX-4410", mode="keyword")[0]["document_id"] == document.pk
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("index_check", stdout=out)
    assert "vector index ok, keyword index ok, database 1, 1 orphan file(s)" in out.getvalue()

    # The next write takes the orphan's version number and replaces it whole.
    factories.document(collection=collection, title="Belt", text="Part DBT-9921.")
    assert keyword_ids(collection) == vector_ids(collection) == chunk_ids(collection)
    assert len(chunk_ids(collection)) == 2
    assert search(api, query="GBX-4410", mode="keyword")[0]["document_id"] == document.pk
    call_command("index_check", stdout=StringIO())  # clean


@pytest.mark.faiss_only
def test_index_check_covers_the_keyword_index(team: Team) -> None:
    collection = factories.collection(team=team, name="checked")
    factories.document(collection=collection, title="Gear", text="The gearbox part is GBX-4410.")
    out = StringIO()
    call_command("index_check", stdout=out)
    assert "ok     acme/checked: 1 vectors, 1 keyword entries" in out.getvalue()

    collection_index_rebuild(collection_id=collection.pk)  # one base, no deltas
    collection.refresh_from_db()
    store = index_store()
    key, version = collection.index_key, collection.index_base
    # A keyword index that lost its folder, then one that holds the wrong chunks.
    import shutil

    shutil.rmtree(store.keyword_path(key, version))
    with pytest.raises(CommandError, match="1 collection"):
        call_command("index_check", stdout=StringIO())
    out = StringIO()
    call_command("index_check", "--repair", stdout=out)
    assert "keyword index unreadable" in out.getvalue()
    assert keyword_ids(collection) == chunk_ids(collection)

    collection.refresh_from_db()
    from retrieval import KeywordIndex

    KeywordIndex.build([999], ["stray"]).write(
        store.keyword_path(collection.index_key, collection.index_base)
    )
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("index_check", stdout=out)
    assert "keyword index 1 (missing 1, extra 1)" in out.getvalue()
    collection_index_rebuild(collection_id=collection.pk)
    call_command("index_check", stdout=StringIO())
    assert keyword_ids(collection) == chunk_ids(collection)
    assert Document.objects.get().status == "indexed"


@pytest.mark.faiss_only
def test_a_collection_indexed_before_keyword_indexes_gets_one_at_its_first_search(
    api: APIClient, library: Collection, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    library = collection_index_rebuild(collection_id=library.pk)  # a whole index, as before
    store = index_store()
    shutil.rmtree(store.keyword_path(library.index_key, library.index_base))
    store.forget(library.index_key)  # as a web process started after the upgrade
    results = search(api, query="XQ-7781-B fans", mode="keyword")
    assert [r["title"] for r in results] == ["Fans"]
    assert "building it from the database" in caplog.text
    assert keyword_ids(library) == vector_ids(library) == chunk_ids(library)


def test_keyword_search_scores_only_the_first_distinct_terms(
    api: APIClient, team: Team, settings: Any
) -> None:
    """A query's keyword work is bounded by ``KEYWORD_MAX_QUERY_TERMS``, not its length:
    a word past the first 64 distinct ones finds nothing."""
    settings.KEYWORD_MAX_QUERY_TERMS = 64
    collection = factories.collection(team=team)
    factories.document(collection=collection, title="Fans", text="Replacement fans ship today.")
    filler = " ".join(f"filler{n}" for n in range(100))
    assert search(api, query=f"{filler} replacement", mode="keyword") == []
    found = search(api, query=f"replacement {filler}", mode="keyword")
    assert [result["title"] for result in found] == ["Fans"]


@pytest.mark.parametrize(
    ("fusion", "soup", "fans"),
    [
        ("rrf", 2 / 61, 1 / 62),  # first in both lists; second in the dense list only
        ("minmax", 1.0, 0.0),  # top of both; bottom of dense, the keyword floor
        ("zscore", 1.0, -0.6),  # dense z 1 and -1; one keyword hit: 1, floor 0
    ],
)
def test_the_fusion_setting_switches_the_hybrid_pipeline(
    api: APIClient, library: Collection, settings: Any, fusion: str, soup: float, fans: float
) -> None:
    settings.SEARCH_FUSION, settings.SEARCH_FUSION_ALPHA = fusion, 0.6
    results = search(api, query="cafeteria soup", top_k=2)
    assert [(r["title"], r["score"]) for r in results] == [
        ("Soup", pytest.approx(soup)),
        ("Fans", pytest.approx(fans)),
    ]


def test_hybrid_fuses_by_document_as_the_setting_says(
    api: APIClient, team: Team, settings: Any
) -> None:
    """With ``SEARCH_FUSION_BY_DOCUMENT`` each document's best chunk takes the document's
    best z-score from each list; its other chunks keep their own (retrieval.fuse)."""
    collection = factories.collection(team=team)
    filler = " ".join(f"filler{n}" for n in range(300))
    # Menu's first chunk is nearly all soup (dense's best of it), its last holds the rare
    # word cafeteria (keyword's best of it, soup being common).
    factories.document(
        collection=collection,
        title="Menu",
        text=f"{'soup ' * 200}. {filler}. The cafeteria, the cafeteria.",
    )
    for title in ("Soup", "Stew", "Broth", "Chowder", "Bisque", "Consomme"):
        factories.document(collection=collection, title=title, text="Soup of the day.")
    query = "cafeteria soup"
    dense = search(api, query=query, mode="dense", top_k=20)
    keyword = search(api, query=query, mode="keyword", top_k=20)
    assert len({r["document_id"] for r in dense}) < len(dense)  # Menu has several chunks
    documents = {int(r["chunk_id"]): int(r["document_id"]) for r in dense + keyword}  # type: ignore[call-overload]

    def hits(results: list[dict[str, object]]) -> list[Hit]:
        return [Hit(int(r["chunk_id"]), float(r["score"])) for r in results]  # type: ignore[call-overload, arg-type]

    expected = {}
    for by_document in (True, False):
        policy = FusionPolicy(method="zscore", alpha=0.5, by_document=by_document)
        fused = fuse(hits(dense), hits(keyword), policy=policy, documents=documents)
        expected[by_document] = [(hit.id, pytest.approx(hit.score)) for hit in fused]
        settings.SEARCH_FUSION, settings.SEARCH_FUSION_ALPHA = "zscore", 0.5
        settings.SEARCH_FUSION_BY_DOCUMENT = by_document
        found = search(api, query=query, top_k=20)
        assert [(r["chunk_id"], r["score"]) for r in found] == expected[by_document]
    assert expected[True] != expected[False]


@pytest.mark.faiss_only
def test_the_bm25_settings_reach_keyword_search(
    api: APIClient, library: Collection, settings: Any
) -> None:
    default = search(api, query="cafeteria", mode="keyword")[0]["score"]
    settings.KEYWORD_BM25_K1 = 0.0  # presence only: the score is the idf, ln(1 + 1.5 / 1.5)
    assert search(api, query="cafeteria", mode="keyword")[0]["score"] == pytest.approx(np.log(2))
    assert default != pytest.approx(np.log(2))


@pytest.mark.parametrize("fusion", ["rrf", "minmax", "zscore"])
def test_another_teams_chunks_never_enter_the_fusion(
    api: APIClient, team: Team, other_team: Team, settings: Any, fusion: str
) -> None:
    settings.SEARCH_FUSION = fusion
    own = factories.collection(team=team, name="own")
    for title in ("Soup", "Bread", "Salad"):
        factories.document(collection=own, title=title, text=f"The cafeteria serves {title}.")
    before = search(api, query="cafeteria soup", top_k=10)
    theirs = factories.collection(team=other_team, name="theirs")
    for i in range(8):  # better matches than any of ours, in both lists
        factories.document(
            collection=theirs, title=f"Soup {i}", text="Cafeteria soup, cafeteria soup."
        )
    after = search(api, query="cafeteria soup", top_k=10)
    # Not returned, and not even seen: a score normalised over their chunks would move.
    assert after == before
    assert {r["collection_id"] for r in after} == {own.pk}


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("SEARCH_FUSION", "borda", "SEARCH_FUSION"),
        ("SEARCH_FUSION_ALPHA", 1.5, "SEARCH_FUSION_ALPHA"),
        ("SEARCH_FUSION_DEPTH", 0, "SEARCH_FUSION_DEPTH"),
        ("KEYWORD_BM25_B", 2.0, "KEYWORD_BM25_B"),
    ],
)
def test_search_settings_out_of_range_fail_the_system_check(
    settings: Any, setting: str, value: object, named: str
) -> None:
    from apps.knowledge.checks import search_settings_check

    assert search_settings_check() == []
    setattr(settings, setting, value)
    (error,) = search_settings_check()
    assert error.id == "knowledge.E001" and named in error.msg
