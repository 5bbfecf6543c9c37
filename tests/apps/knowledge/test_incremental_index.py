"""Appends, tombstones, a crash before the commit, then compaction: searches through the
API answer exactly as over a full rebuild, and ``index_check`` is clean (fake embedder,
real FAISS and keyword postings)."""

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
from apps.knowledge.models import Chunk, Collection
from apps.knowledge.services import (
    collection_delete,
    collection_index_compact,
    collection_index_load,
    collection_index_rebuild,
    collections_compact,
    document_delete,
    document_ingest,
    document_reingest,
    index_store,
)
from apps.knowledge.services.indexing import collection_index_append
from retrieval import SegmentedIndex
from tests import factories
from tests.apps.knowledge.searching import MODES, Answers
from tests.apps.knowledge.searching import answers as search_answers

pytestmark = pytest.mark.django_db

QUERIES = ["gearbox GBX-4410", "drive belt", "pump seal", "valve", "manual torque"]
TOPICS = ["gearbox GBX-4410", "drive belt DBT-9921", "pump seal", "valve body", "torque table"]


class Crash(Exception):
    pass


@pytest.fixture
def committed(django_capture_on_commit_callbacks: Any) -> Callable[..., Any]:
    """Call a service and run its on-commit work (cache, prune, compaction) right after,
    as its commit would outside the test's transaction."""

    def call(service: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            result = service(*args, **kwargs)
        return result

    return call


def answers(api: APIClient, collection: Collection) -> Answers:
    return search_answers(api, collection, QUERIES)


def live_chunks(collection: Collection) -> set[int]:
    return set(
        Chunk.objects.filter(collection=collection, document__status="indexed").values_list(
            "pk", flat=True
        )
    )


def manual(collection: Collection, number: int) -> Any:
    topic = TOPICS[number % len(TOPICS)]
    text = "\n\n".join(
        f"## Section {s}\n\nThe {topic} manual, part {number}.{s}: torque, wear and "
        f"replacement of the {topic} in unit {number * 10 + s}."
        for s in range(3)
    )
    return factories.document(collection=collection, title=f"Manual {number}", text=text)


def test_adds_deletes_a_crash_and_compaction_answer_as_a_full_rebuild(
    api: APIClient, team: Team, settings: Any, committed: Callable[..., Any]
) -> None:
    settings.INDEX_COMPACT_DELTAS = 1000  # compaction only when this test says
    collection = factories.collection(team=team, name="manuals")
    documents = [manual(collection, number) for number in range(8)]
    document_delete(document=documents[1])  # tombstones
    document_ingest(document_id=document_reingest(document=documents[2]).pk)  # out, then in
    document_ingest(document_id=documents[3].pk)  # a re-delivered stage: nothing changes
    collection.refresh_from_db()
    assert collection.index_base == 0 and collection.index_version == 11  # deltas only

    # The process dies between the segment write and the commit.
    with pytest.raises(Crash), transaction.atomic():
        every = np.array(sorted(live_chunks(collection)), dtype=np.int64)
        collection_index_append(
            collection_id=collection.pk,
            ids=every[:0],
            vectors=np.zeros((0, 384), dtype=np.float32),
            tombstones=every,
        )
        raise Crash
    collection.refresh_from_db()
    assert collection.index_version == 11
    assert index_store().delta_path(collection.index_key, 12).is_dir()  # the orphan
    incremental = answers(api, collection)
    assert all(incremental[mode][0] for mode in MODES)  # the orphan's tombstones ignored
    assert sorted(collection_index_load(collection).ids()) == sorted(live_chunks(collection))

    out = StringIO()
    with pytest.raises(CommandError):
        call_command("index_check", stdout=out)
    assert "1 orphan file(s)" in out.getvalue() and "vector index ok" in out.getvalue()
    out = StringIO()
    call_command("index_check", "--repair", stdout=out)
    assert "removed 1 orphan file(s)" in out.getvalue() and "rebuilt" not in out.getvalue()
    call_command("index_check", stdout=StringIO())  # clean

    assert committed(collection_index_compact, collection_id=collection.pk, force=True)
    collection.refresh_from_db()
    assert collection.index_base == collection.index_version == 11
    assert answers(api, collection) == incremental
    manual(collection, 8)  # a delta after the new base
    collection.refresh_from_db()
    after_compaction = answers(api, collection)

    rebuilt = committed(collection_index_rebuild, collection_id=collection.pk)
    assert rebuilt.index_base == rebuilt.index_version == 13
    assert answers(api, rebuilt) == after_compaction
    call_command("index_check", stdout=StringIO())  # clean
    # Only the live base and the state one behind are left on disk.
    names = sorted(p.name for p in (index_store().root / collection.index_key).iterdir())
    assert names == [
        "0000000011.bm25",
        "0000000011.faiss",
        "0000000012.delta",
        "0000000013.bm25",
        "0000000013.faiss",
    ]


@pytest.mark.usefixtures("index_backend")
def test_filters_over_deltas_never_leak_another_teams_chunk(
    api: APIClient, team: Team, other_team: Team
) -> None:
    mine = factories.collection(team=team, name="mine")
    theirs = factories.collection(team=other_team, name="theirs")
    own = factories.document(collection=mine, title="Gear", text="Gearbox GBX-4410 torque.")
    secret = factories.document(collection=theirs, title="Gear", text="Gearbox GBX-4410 secret.")
    factories.document(collection=theirs, title="Belt", text="Belt DBT-9921 secret.")
    document_delete(document=factories.document(collection=mine, title="Old", text="Gearbox."))
    for mode in MODES:
        for body in (
            {"filters": {"document_ids": [secret.pk]}},
            {"filters": {"titles": ["Gear"]}},
            {"collection_ids": [theirs.pk]},
            {},
        ):
            response = api.post(
                "/api/v1/search", {"query": "gearbox GBX-4410", "mode": mode, **body}, format="json"
            )
            ids = [r["document_id"] for r in response.json().get("results", [])]
            assert secret.pk not in ids and set(ids) <= {own.pk}, (mode, body)


def test_compaction_is_triggered_past_the_delta_count_and_by_the_beat(
    team: Team, settings: Any, committed: Callable[..., Any]
) -> None:
    settings.INDEX_COMPACT_DELTAS = 3
    collection = factories.collection(team=team, name="busy")
    for number in range(2):
        committed(manual, collection, number)
    collection.refresh_from_db()
    assert (collection.index_base, collection.index_version) == (0, 2)
    # The third delta: its commit queues the compaction (run eagerly here).
    committed(manual, collection, 2)
    collection.refresh_from_db()
    assert collection.index_base == collection.index_version == 3

    # The beat: nothing due, then a share of tombstones past the ratio.
    settings.INDEX_COMPACT_DELTAS = 1000
    settings.INDEX_COMPACT_TOMBSTONE_RATIO = 0.2  # 3 of 12 vectors held are dead
    extra = manual(collection, 3)
    assert committed(collections_compact) == 0
    document_delete(document=extra)
    assert committed(collections_compact) == 1
    collection.refresh_from_db()
    assert collection.index_base == collection.index_version == 5
    assert sorted(collection_index_load(collection).ids()) == sorted(live_chunks(collection))


def test_a_compaction_that_loses_its_race_publishes_nothing(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    collection = factories.collection(team=team, name="raced")
    manual(collection, 0)
    manual(collection, 1)
    compact = SegmentedIndex.compact

    def rebuilt_meanwhile(self: SegmentedIndex, **options: Any) -> Any:
        merged = compact(self, **options)
        collection_index_rebuild(collection_id=collection.pk)  # another writer's new base
        return merged

    monkeypatch.setattr(SegmentedIndex, "compact", rebuilt_meanwhile)
    assert not collection_index_compact(collection_id=collection.pk, force=True)
    collection.refresh_from_db()
    assert collection.index_base == collection.index_version == 3  # the rebuild's
    assert not index_store().path(collection.index_key, 2).exists()  # its file removed
    call_command("index_check", stdout=StringIO())


def test_a_collection_deleted_during_compaction_leaves_no_folder(
    team: Team, other_team: Team, monkeypatch: pytest.MonkeyPatch, committed: Callable[..., Any]
) -> None:
    """Issue 27, item 9: the compaction wrote its new base into the folder the delete had
    just removed, and left it there."""
    collection = factories.collection(team=team, name="doomed")
    manual(collection, 0)
    manual(collection, 1)
    kept = factories.collection(team=other_team, name="kept")
    manual(kept, 0)
    folder = index_store().root / collection.index_key
    compact = SegmentedIndex.compact

    def deleted_meanwhile(self: SegmentedIndex, **options: Any) -> Any:
        merged = compact(self, **options)
        committed(collection_delete, collection=Collection.objects.get(pk=collection.pk))
        assert not folder.exists()  # the delete's own cleanup, on its commit
        return merged

    monkeypatch.setattr(SegmentedIndex, "compact", deleted_meanwhile)
    assert not collection_index_compact(collection_id=collection.pk, force=True)
    assert not folder.exists()
    assert not Collection.objects.filter(pk=collection.pk).exists()
    kept.refresh_from_db()
    assert (index_store().root / kept.index_key).is_dir()
    assert len(collection_index_load(kept).ids()) == Chunk.objects.filter(collection=kept).count()
