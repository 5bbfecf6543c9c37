"""The pipeline's stages: idempotent under re-delivery, stalled documents swept, drift repaired."""

import shutil
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from apps.accounts.models import Team
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import (
    STAGE_FUNCTIONS,
    collection_index_compact,
    collection_index_load,
    document_create_from_text,
    document_delete,
    document_ingest,
    document_reingest,
    documents_requeue_stalled,
    index_state,
    index_store,
)
from apps.usage.models import UsageRecord
from tests import factories

pytestmark = pytest.mark.django_db

TEXT = "\n\n".join(
    f"## Part {i}\n\n" + " ".join(f"word{i}x{j}" for j in range(40)) for i in range(6)
)


def index_size(collection: Collection) -> int:
    collection.refresh_from_db()
    return len(index_store().read_state(collection.index_key, index_state(collection)))


def accepted(team: Team) -> Document:
    collection = factories.collection(team=team)
    return document_create_from_text(
        collection=collection, title="Doc", text=TEXT, format="markdown", enqueue=False
    ).document


def test_every_stage_twice_changes_nothing_the_second_time(team: Team) -> None:
    document = accepted(team)
    for stage, run in STAGE_FUNCTIONS.items():
        run(document_id=document.pk)
        snapshot = list(Chunk.objects.filter(document=document).values_list("pk", "index", "text"))
        run(document_id=document.pk)  # a re-delivered task: acks late, worker lost
        assert (
            list(Chunk.objects.filter(document=document).values_list("pk", "index", "text"))
            == snapshot
        ), stage
    document.refresh_from_db()
    assert (document.status, document.progress, document.chunk_count) == ("indexed", 100, 6)
    assert index_size(document.collection) == 6
    assert UsageRecord.objects.filter(operation="ingest").count() == 1


def test_a_crash_mid_embedding_resumes_without_re_embedding(team: Team, settings: object) -> None:
    settings.EMBED_BATCH_SIZE = 2  # type: ignore[attr-defined]
    document = accepted(team)
    STAGE_FUNCTIONS["parse"](document_id=document.pk)
    STAGE_FUNCTIONS["chunk"](document_id=document.pk)
    # Simulate a worker that embedded the first batch and died.
    first = list(Chunk.objects.filter(document=document)[:2])
    for chunk in first:
        chunk.embedding = b"\0" * (384 * 4)
    Chunk.objects.bulk_update(first, ["embedding"])
    Document.objects.filter(pk=document.pk).update(embedding_tokens=7)
    STAGE_FUNCTIONS["embed"](document_id=document.pk)
    STAGE_FUNCTIONS["index"](document_id=document.pk)
    document.refresh_from_db()
    assert document.status == "indexed"
    # The pre-crash batch kept its (zero) vectors: it was not embedded again.
    assert Chunk.objects.get(pk=first[0].pk).embedding == b"\0" * (384 * 4)
    per_chunk = Chunk.objects.exclude(pk__in=[c.pk for c in first]).values_list(
        "token_count", flat=True
    )
    assert document.embedding_tokens == 7 + sum(tokens + 2 for tokens in per_chunk)
    assert UsageRecord.objects.get(operation="ingest").prompt_tokens == document.embedding_tokens


def test_stalled_documents_are_requeued_then_failed(team: Team, settings: object) -> None:
    settings.DOCUMENT_MAX_ATTEMPTS = 2  # type: ignore[attr-defined]
    settings.CELERY_TASK_ALWAYS_EAGER = True  # type: ignore[attr-defined]
    document = accepted(team)
    long_ago = timezone.now() - timedelta(hours=2)
    Document.objects.filter(pk=document.pk).update(updated_at=long_ago, attempts=1)
    fresh = document_create_from_text(
        collection=document.collection, title="New", text="new text", enqueue=False
    ).document
    assert documents_requeue_stalled() == (1, 0)
    document.refresh_from_db()
    assert document.attempts == 2
    assert Document.objects.get(pk=fresh.pk).attempts == 0  # not stalled: left alone

    Document.objects.filter(pk=document.pk).update(updated_at=long_ago)
    assert documents_requeue_stalled() == (0, 1)
    document.refresh_from_db()
    assert document.status == "failed"
    assert "stalled at stage 'parse' after 2 attempts" in document.error


def test_reingest_replaces_chunks_and_vectors(team: Team) -> None:
    document = accepted(team)
    document_ingest(document_id=document.pk)
    old_chunks = set(Chunk.objects.filter(document=document).values_list("pk", flat=True))
    document = document_reingest(document=document)
    assert index_size(document.collection) == 0
    document_ingest(document_id=document.pk)
    new_chunks = set(Chunk.objects.filter(document=document).values_list("pk", flat=True))
    assert len(new_chunks) == 6 and not old_chunks & new_chunks
    collection = document.collection
    collection.refresh_from_db()
    ids = collection_index_load(collection).ids()
    assert set(ids.tolist()) == new_chunks


def test_index_check_reports_drift_and_repairs_it(team: Team, settings: object) -> None:
    document = accepted(team)
    document_ingest(document_id=document.pk)
    out = StringIO()
    call_command("index_check", stdout=out)
    assert "ok     acme/docs: 6 vectors" in out.getvalue()

    collection = document.collection
    collection.refresh_from_db()
    shutil.rmtree(index_store().delta_path(collection.index_key, collection.index_version))
    with pytest.raises(CommandError, match="1 collection"):
        call_command("index_check", stdout=StringIO())
    out = StringIO()
    call_command("index_check", "--repair", stdout=out)
    assert "DRIFT" in out.getvalue() and "rebuilt from 6" in out.getvalue()
    assert index_size(collection) == 6
    call_command("index_check", stdout=StringIO())  # clean again


def test_ingest_command_loads_a_folder_with_progress(team: Team, tmp_path: Path) -> None:
    tmp_path = tmp_path / "corpus"
    tmp_path.mkdir()
    (tmp_path / "a.md").write_text("# Alpha\n\nFirst doc.")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("Second doc.")
    (tmp_path / "ignored.bin").write_bytes(b"\0")
    out, err = StringIO(), StringIO()
    call_command("ingest", str(tmp_path), team="acme", collection="bulk", stdout=out, stderr=err)
    assert out.getvalue().strip() == "bulk: 2 indexed"
    assert "2/2" in err.getvalue()  # the progress bar
    out = StringIO()
    call_command("ingest", str(tmp_path), team="acme", collection="bulk", stdout=out, stderr=err)
    assert out.getvalue().strip() == "bulk: 2 existing"
    assert Document.objects.filter(status="indexed").count() == 2
    with pytest.raises(CommandError, match="no team"):
        call_command("ingest", str(tmp_path), team="nope", collection="x", stdout=out, stderr=err)


def test_hnsw_by_setting_supports_delete_and_search(team: Team, settings: object) -> None:
    settings.VECTOR_INDEX_KIND = "hnsw"  # type: ignore[attr-defined]
    collection = factories.collection(team=team)
    keep = factories.document(collection=collection, title="Keep", text="Jupiter is large.")
    drop = factories.document(collection=collection, title="Drop", text="Mercury is small.")
    document_delete(document=drop)
    # Writes append flat deltas; compaction builds the base as the setting says.
    assert collection_index_compact(collection_id=collection.pk, force=True)
    collection.refresh_from_db()
    index = collection_index_load(collection)
    assert [segment.vectors.kind for segment in index.segments] == ["hnsw"]
    assert set(index.ids().tolist()) == set(
        Chunk.objects.filter(document=keep).values_list("pk", flat=True)
    )
