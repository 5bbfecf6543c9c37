"""The ingestion pipeline: parse → chunk → embed → index, one idempotent stage at a time.

Each stage loads the document, does its work only if the document is at that stage, and
moves it to the next in the same transaction as its results. A re-delivered task (acks
late, worker lost) therefore repeats nothing that was committed: chunks are unique per
document and position, embeddings are computed only for chunks that lack one, and
vectors enter the index in the transaction that marks the document indexed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import PurePath

from celery import chain
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.knowledge.models import Chunk, Document
from apps.knowledge.services.indexing import chunk_vectors, collection_index_write, embedder
from apps.usage.models import UsageRecord
from apps.usage.services import usage_record_embedding
from config.celery import app as celery_app
from retrieval import (
    Block,
    DocumentTooLarge,
    ParsedDocument,
    RetrievalError,
    UnsupportedDocument,
    VectorIndex,
    chunk_document,
    embedding_text,
    parse_document,
)

logger = logging.getLogger(__name__)

Stage = Document.Stage
STAGES: tuple[str, ...] = (Stage.PARSE, Stage.CHUNK, Stage.EMBED, Stage.INDEX)
TASKS = {stage: f"apps.knowledge.tasks.document_{stage}" for stage in STAGES}
PROGRESS = {Stage.PARSE: 0, Stage.CHUNK: 10, Stage.EMBED: 20, Stage.INDEX: 90, Stage.DONE: 100}


def ingestion_enqueue(*, document: Document) -> None:
    """Queue the rest of the pipeline, from the document's current stage, after commit."""
    Document.objects.filter(pk=document.pk).update(
        attempts=F("attempts") + 1, updated_at=timezone.now()
    )
    remaining = STAGES[STAGES.index(document.stage) :] if document.stage in STAGES else ()
    if not remaining:
        return
    signatures = [
        celery_app.signature(TASKS[stage], args=[document.pk], immutable=True)
        for stage in remaining
    ]
    transaction.on_commit(lambda: chain(*signatures).apply_async())


def document_ingest(
    *, document_id: int, on_progress: Callable[[int], None] | None = None
) -> Document:
    """Run every remaining stage in this process (bulk loads, tests, eager mode)."""
    for stage in STAGES:
        STAGE_FUNCTIONS[stage](document_id=document_id)
        if on_progress is not None:
            on_progress(
                Document.objects.filter(pk=document_id).values_list("progress", flat=True).first()
                or 0
            )
    return Document.objects.get(pk=document_id)


def _claim(document_id: int, stage: str) -> Document | None:
    """The document, locked, if it is waiting for ``stage``; None if gone or elsewhere."""
    document = Document.objects.select_for_update().filter(pk=document_id).first()
    if document is None or document.stage != stage:
        return None
    if document.status not in (Document.Status.QUEUED, Document.Status.PROCESSING):
        return None
    return document


def _advance(document: Document, stage: str, **fields: object) -> None:
    document.status = Document.Status.INDEXED if stage == Stage.DONE else Document.Status.PROCESSING
    document.stage = stage
    document.progress = PROGRESS[stage]
    for name, value in fields.items():
        setattr(document, name, value)
    document.save()


def document_fail(*, document_id: int, error: str) -> None:
    with transaction.atomic():
        document = Document.objects.select_for_update().filter(pk=document_id).first()
        if document is None or document.status == Document.Status.INDEXED:
            return
        if document.stage == Stage.EMBED and document.embedding_tokens:
            # Tokens already spent on a failed job are still charged, marked as such.
            _charge(document, status=UsageRecord.Status.ERROR)
        document.status = Document.Status.FAILED
        document.error = error[:2000]
        document.save(update_fields=["status", "error", "updated_at"])
    logger.info("document %s failed: %s", document_id, error)


def _guarded(stage: Callable[[Document], None]) -> Callable[..., None]:
    """Run a stage under the document's row lock; document errors fail the document."""

    def run(*, document_id: int) -> None:
        try:
            with transaction.atomic():
                document = _claim(document_id, stage.__name__.removeprefix("_"))
                if document is not None:
                    stage(document)
        except RetrievalError as exc:
            document_fail(document_id=document_id, error=str(exc))

    run.__name__ = stage.__name__
    return run


@_guarded
def _parse(document: Document) -> None:
    with document.source.open("rb") as handle:
        data = handle.read()
    # The document's own title (Markdown H1, HTML <title>, PDF metadata) beats a file name.
    parsed = parse_document(
        data,
        media_type=document.media_type,
        title="",
        max_pages=settings.MAX_PDF_PAGES,
    )
    title = document.title
    if parsed.title and (not title or title == PurePath(document.filename).stem):
        title = parsed.title[:300]
    if parsed.char_count > settings.MAX_DOCUMENT_CHARS:
        raise _too_large(
            f"{parsed.char_count} characters; the limit is {settings.MAX_DOCUMENT_CHARS}"
        )
    if not parsed.blocks:
        raise _empty()
    blocks = [[block.text, list(block.headings), block.page] for block in parsed.blocks]
    _advance(
        document,
        Stage.CHUNK,
        title=title,
        parsed={"title": title, "blocks": blocks},
        page_count=parsed.page_count or document.page_count,
    )


@_guarded
def _chunk(document: Document) -> None:
    parsed = document.parsed or {"title": document.title, "blocks": []}
    blocks = [Block(text, tuple(headings), page) for text, headings, page in parsed["blocks"]]
    model = embedder()
    chunks = chunk_document(
        ParsedDocument(title=document.title or parsed["title"], blocks=blocks),
        count_tokens=model.count_tokens,
        max_tokens=model.max_tokens - 2,  # room for the model's [CLS] and [SEP]
        overlap_tokens=settings.CHUNK_OVERLAP_TOKENS,
        max_chunks=settings.MAX_CHUNKS_PER_DOCUMENT,
    )
    Chunk.objects.filter(document=document).delete()  # a repeated stage starts clean
    Chunk.objects.bulk_create(
        Chunk(
            document=document,
            collection_id=document.collection_id,
            index=chunk.index,
            text=chunk.text,
            headings=list(chunk.headings),
            token_count=chunk.token_count,
        )
        for chunk in chunks
    )
    _advance(document, Stage.EMBED, chunk_count=len(chunks), parsed=None)


def _embed_stage(*, document_id: int) -> None:
    """Embed in batches, each committed, so a crash resumes where it stopped.

    Unlike the other stages this one commits per batch, outside one long transaction.
    """
    model = embedder()
    batch_size = settings.EMBED_BATCH_SIZE
    while True:
        with transaction.atomic():
            document = _claim(document_id, Stage.EMBED)
            if document is None:
                return
            batch = list(
                Chunk.objects.filter(document=document, embedding__isnull=True)[:batch_size]
            )
            if not batch:
                _charge(document, status=UsageRecord.Status.OK)
                _advance(document, Stage.INDEX)
                return
            title = document.title
            embedded = model.embed([_embedding_text(title, chunk) for chunk in batch])
            for chunk, vector in zip(batch, embedded.vectors, strict=True):
                chunk.embedding = vector.astype("float32").tobytes()
            Chunk.objects.bulk_update(batch, ["embedding"])
            done = (
                document.chunk_count
                - Chunk.objects.filter(document=document, embedding__isnull=True).count()
            )
            span = PROGRESS[Stage.INDEX] - PROGRESS[Stage.EMBED]
            document.embedding_tokens += embedded.token_count
            document.progress = PROGRESS[Stage.EMBED] + span * done // max(document.chunk_count, 1)
            document.status = Document.Status.PROCESSING
            document.save(update_fields=["embedding_tokens", "progress", "status", "updated_at"])


def _embedding_text(title: str, chunk: Chunk) -> str:
    return embedding_text(title, tuple(chunk.headings), chunk.text)


def _charge(document: Document, *, status: str) -> None:
    usage_record_embedding(
        team=document.team,
        model=embedder().model_name,
        tokens=document.embedding_tokens,
        operation="ingest",
        object_id=str(document.pk),
        status=status,
    )


@_guarded
def _index(document: Document) -> None:
    ids, vectors = chunk_vectors(Chunk.objects.filter(document=document).only("pk", "embedding"))

    def add(index: VectorIndex) -> None:
        index.remove(ids)  # a re-delivered stage must not add twice
        index.add(ids, vectors)

    collection_index_write(collection_id=document.collection_id, mutate=add)
    _advance(document, Stage.DONE, indexed_at=timezone.now())


def _too_large(detail: str) -> RetrievalError:
    return DocumentTooLarge(f"the document has {detail}", code="document_too_large")


def _empty() -> RetrievalError:
    return UnsupportedDocument("the document contains no text")


def _embed(*, document_id: int) -> None:
    try:
        _embed_stage(document_id=document_id)
    except RetrievalError as exc:
        document_fail(document_id=document_id, error=str(exc))


STAGE_FUNCTIONS: dict[str, Callable[..., None]] = {
    Stage.PARSE: _parse,
    Stage.CHUNK: _chunk,
    Stage.EMBED: _embed,
    Stage.INDEX: _index,
}


def documents_requeue_stalled() -> tuple[int, int]:
    """Re-queue documents whose stage has not moved for too long; fail them past the limit.

    Returns (re-queued, failed).
    """
    cutoff = timezone.now() - timedelta(seconds=settings.DOCUMENT_STALL_SECONDS)
    stalled = Document.objects.filter(
        status__in=[Document.Status.QUEUED, Document.Status.PROCESSING], updated_at__lt=cutoff
    ).values_list("pk", flat=True)
    requeued = failed = 0
    for document_id in list(stalled):
        with transaction.atomic():
            document = (
                Document.objects.select_for_update()
                .filter(pk=document_id, updated_at__lt=cutoff)
                .first()
            )
            if document is None:
                continue
            if document.attempts >= settings.DOCUMENT_MAX_ATTEMPTS:
                failed += 1
            else:
                ingestion_enqueue(document=document)
                requeued += 1
                continue
        document_fail(
            document_id=document_id,
            error=f"ingestion stalled at stage {document.stage!r} "
            f"after {document.attempts} attempts",
        )
    return requeued, failed
