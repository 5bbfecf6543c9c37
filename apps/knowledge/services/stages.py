"""The ingestion stages: parse → chunk → embed → index, one idempotent stage at a time.

Each stage reads the document without a lock, does its slow work (parsing, embedding)
outside any transaction, then commits its results together with the move to the next
stage, under the document's row lock and only if the document is still at that stage. A
re-delivered task (acks late, worker lost) therefore repeats nothing that was committed,
and the database is never locked while a model runs (on SQLite that would stall every
writer, the web server included). Chunks are unique per document and position, embeddings
are computed only for chunks that lack one, and vectors enter the index in the transaction
that marks the document indexed.

Embedding draws on the team's period quotas (kind ``embedding``): before the first batch,
the embed stage reserves the exact tokens the document will cost and keeps the
reservation on the document; charging the ledger settles it in the same transaction, and
so do failing and deleting the document. A refused reservation fails the document before
anything is embedded; its source stays, so it can be re-ingested once the quota allows.

Which stage runs when is the dispatcher's business (:mod:`.dispatch`); how a worker runs
one, :mod:`.ingestion`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import PurePath

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.core.crypto import decrypt_bytes
from apps.knowledge.models import Chunk, Document
from apps.knowledge.services.indexing import chunk_vectors, collection_index_append, embedder
from apps.usage.budgets import RateLimited, budget_reserve, budget_settle
from apps.usage.models import Reservation, UsageRecord
from apps.usage.services import embedding_cost, usage_record_embedding
from retrieval import (
    DocumentTooLarge,
    ParsedDocument,
    RetrievalError,
    UnsupportedDocument,
    chunk_document,
    embedding_text,
    parse_document_bounded,
)

logger = logging.getLogger(__name__)

Stage = Document.Stage
STAGES: tuple[str, ...] = (Stage.PARSE, Stage.CHUNK, Stage.EMBED, Stage.INDEX)
PROGRESS: dict[str, int] = {
    Stage.PARSE: 0,
    Stage.CHUNK: 10,
    Stage.EMBED: 20,
    Stage.INDEX: 90,
    Stage.DONE: 100,
}
ACTIVE = (Document.Status.QUEUED, Document.Status.PROCESSING)


def document_ingest(*, document_id: int) -> Document:
    """Run every remaining stage in this process (bulk loads, tests)."""
    for stage in STAGES:
        STAGE_FUNCTIONS[stage](document_id=document_id)
    return Document.objects.get(pk=document_id)


def document_fail(*, document_id: int, error: str) -> None:
    with transaction.atomic():
        document = Document.objects.select_for_update().filter(pk=document_id).first()
        if document is None or document.status not in ACTIVE:
            return
        if document.stage == Stage.EMBED and document.embedding_tokens:
            # Tokens already spent on a failed job are still charged, marked as such.
            _charge(document, status=UsageRecord.Status.ERROR)
        else:
            _settle(document)
        document.status = Document.Status.FAILED
        document.error = error[:2000]
        document.save(update_fields=["status", "error", "updated_at"])
    logger.info("document %s failed: %s", document_id, error)


def document_release(*, document: Document) -> None:
    """Settle the document's quota reservation, if it holds one, on the tokens it spent.

    For a document about to be deleted or re-ingested, with its row locked inside the
    transaction that does it: a run caught in the embed stage is charged (as cancelled)
    for what it embedded so far, the rest of the reservation goes back to the team.
    """
    if document.status in ACTIVE and document.stage == Stage.EMBED and document.embedding_tokens:
        _charge(document, status=UsageRecord.Status.CANCELLED)
    else:
        _settle(document)


def _peek(document_id: int, stage: str) -> Document | None:
    """The document if it is waiting for ``stage``; None if gone, failed or further on."""
    document = Document.objects.filter(pk=document_id, stage=stage, status__in=ACTIVE).first()
    return document


def document_claim(document_id: int, stage: str) -> Document | None:
    """The document if it is waiting for ``stage``, its row locked for the rest of the
    transaction; None if gone, failed or further on."""
    return (
        Document.objects.select_for_update()
        .filter(pk=document_id, stage=stage, status__in=ACTIVE)
        .first()
    )


def _advance(document: Document, stage: str, **fields: object) -> None:
    document.status = Document.Status.INDEXED if stage == Stage.DONE else Document.Status.PROCESSING
    document.stage = stage
    document.progress = PROGRESS[stage]
    for name, value in fields.items():
        setattr(document, name, value)
    document.save()


def _failing_the_document(stage: Callable[..., None]) -> Callable[..., None]:
    """A document that cannot be read or is too large fails with the reason, its error
    starting with the code (``too_many_pages: …``, ``unsupported_document: …``), and the
    stage returns, so its place with the workers goes to the next document at once; other
    errors propagate (the task retries transient ones; the stalled sweep catches the rest)."""

    def run(*, document_id: int, **options: object) -> None:
        try:
            stage(document_id, **options)
        except (DocumentTooLarge, UnsupportedDocument) as exc:
            document_fail(document_id=document_id, error=f"{exc.code}: {exc}")
        except RetrievalError as exc:
            document_fail(document_id=document_id, error=str(exc))

    return run


@_failing_the_document
def _parse(document_id: int) -> None:
    document = _peek(document_id, Stage.PARSE)
    if document is None:
        return
    with document.source.open("rb") as handle:
        data = decrypt_bytes(handle.read())
    # In a child process bounded in time and memory: whatever the file does to the parser
    # (deep recursion, a decompression bomb, a crash) fails this document and no other.
    # Pages are counted here, not at upload, so the web process never reads a PDF.
    parsed = parse_document_bounded(
        data,
        media_type=document.media_type,
        title="",
        max_pages=settings.MAX_PDF_PAGES,  # refused before any page is read
        max_chars=settings.MAX_DOCUMENT_CHARS,  # a PDF stops being read past it
        max_html_elements=settings.MAX_HTML_ELEMENTS,  # refused before the tree is built
        memory_limit_mb=settings.PARSE_MEMORY_LIMIT_MB,
        time_limit_seconds=settings.PARSE_TIME_LIMIT_SECONDS,
    )
    if not parsed.blocks:
        raise UnsupportedDocument("the document contains no text", code="empty_document")
    # The document's own title (Markdown H1, HTML <title>, PDF metadata) beats a file name.
    title = document.title
    if parsed.title and (not title or title == PurePath(document.filename).stem):
        title = parsed.title[:300]
    blocks = parsed.to_json()  # each heading path stored once, not in every block
    with transaction.atomic():
        document = document_claim(document_id, Stage.PARSE)
        if document is not None:
            page_count = parsed.page_count or document.page_count
            _advance(document, Stage.CHUNK, title=title, parsed=blocks, page_count=page_count)


@_failing_the_document
def _chunk(document_id: int) -> None:
    document = _peek(document_id, Stage.CHUNK)
    if document is None:
        return
    parsed = ParsedDocument.from_json(document.parsed or [], title=document.title)
    model = embedder()
    chunks = chunk_document(
        parsed,
        count_tokens=model.count_tokens,
        max_tokens=model.max_tokens - 2,  # room for the model's [CLS] and [SEP]
        overlap_tokens=settings.CHUNK_OVERLAP_TOKENS,
        max_chunks=settings.MAX_CHUNKS_PER_DOCUMENT,
    )
    with transaction.atomic():
        document = document_claim(document_id, Stage.CHUNK)
        if document is None:
            return
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


@_failing_the_document
def _embed(document_id: int, *, slice_seconds: float | None = None) -> None:
    """Embed in batches, each committed, so that a crash resumes where it stopped.

    With ``slice_seconds``, return before the first batch that would start past that time
    (at least one runs), the document still at this stage: the caller queues the rest as
    a new delivery.
    """
    model = embedder()
    span = PROGRESS[Stage.INDEX] - PROGRESS[Stage.EMBED]
    deadline = None if slice_seconds is None else time.monotonic() + slice_seconds
    embedded_any = False
    while (document := _peek(document_id, Stage.EMBED)) is not None:
        pending = Chunk.objects.filter(document=document, embedding__isnull=True)
        batch = list(pending[: settings.EMBED_BATCH_SIZE])
        if batch and embedded_any and deadline is not None and time.monotonic() >= deadline:
            return
        if not batch:
            with transaction.atomic():
                document = document_claim(document_id, Stage.EMBED)
                if document is not None:
                    _charge(document, status=UsageRecord.Status.OK)
                    _advance(document, Stage.INDEX)
            return
        if not _holds_reservation(document):
            if not _embedding_reserve(document):
                return
            continue  # read the document and its batch again, now that it holds the tokens
        embedded = model.embed(
            [embedding_text(document.title, tuple(c.headings), c.text) for c in batch]
        )
        for chunk, vector in zip(batch, embedded.vectors, strict=True):
            chunk.embedding = vector.tobytes()
        with transaction.atomic():
            document = document_claim(document_id, Stage.EMBED)
            if document is None:
                return
            if pending.filter(pk__in=[chunk.pk for chunk in batch]).count() < len(batch):
                continue  # a duplicate delivery committed this batch first, and its tokens
            Chunk.objects.bulk_update(batch, ["embedding"])
            done = document.chunk_count - pending.count()
            document.embedding_tokens += embedded.token_count
            document.progress = PROGRESS[Stage.EMBED] + span * done // max(document.chunk_count, 1)
            document.save(update_fields=["embedding_tokens", "progress", "updated_at"])
        embedded_any = True


def _holds_reservation(document: Document) -> bool:
    return (
        document.reservation_id is not None
        and Reservation.objects.filter(pk=document.reservation_id, settled_at__isnull=True).exists()
    )


def _embedding_reserve(document: Document) -> bool:
    """Hold the document's embedding tokens against the team's quotas; False if it is no
    longer waiting to be embedded or the quota refused it (the document then fails).

    Counted before taking the row lock (SQLite's IMMEDIATE transactions would hold every
    writer meanwhile), and again under it only if a batch landed in between. Under the lock
    a re-delivered or resumed stage finds the reservation and takes no second one; a
    reservation the expiry sweep released meanwhile (a run longer than its lifetime) is
    taken afresh.
    """
    tokens = _embedding_cost(document)
    try:
        with transaction.atomic():
            locked = document_claim(document.pk, Stage.EMBED)
            if locked is None:
                return False
            if _holds_reservation(locked):
                return True
            if (locked.title, locked.embedding_tokens) != (
                document.title,
                document.embedding_tokens,
            ):
                tokens = _embedding_cost(locked)  # a batch landed meanwhile: count again
            locked.reservation = budget_reserve(
                team=locked.team,
                api_key=locked.api_key,
                tokens=tokens,
                cost=embedding_cost(model=embedder().model_name, tokens=tokens),
                kind=UsageRecord.Kind.EMBEDDING,
                tag=locked.tag,
            )
            locked.save(update_fields=["reservation", "updated_at"])
            return True
    except RateLimited as exc:
        unit = "usd" if exc.code == "budget_exceeded" else "tokens"
        remaining = exc.headers.get(f"x-ratelimit-remaining-{unit}", "?")
        document_fail(
            document_id=document.pk,
            error=f"{exc.code}: the team's embedding quota is spent (this document needs "
            f"{tokens} tokens; {remaining} {unit} remain); "
            f"retry in {exc.headers.get('Retry-After', '?')} s",
        )
        return False


def _embedding_cost(document: Document) -> int:
    """Exactly what the run will have cost when done: the tokens already spent plus what
    ``embed()`` will count for every chunk still lacking a vector."""
    pending = Chunk.objects.filter(document=document, embedding__isnull=True)
    texts = [
        embedding_text(document.title, tuple(headings), text)
        for headings, text in pending.values_list("headings", "text")
    ]
    return document.embedding_tokens + embedder().count_embedding_tokens(texts)


def _charge(document: Document, *, status: str) -> None:
    """Write the document's embedding tokens to the ledger and settle its reservation on
    them. Call inside the transaction that holds the document's row lock."""
    usage_record_embedding(
        team=document.team,
        api_key=document.api_key,
        model=embedder().model_name,
        tokens=document.embedding_tokens,
        operation="ingest",
        object_id=str(document.pk),
        status=status,
        tag=document.tag,
    )
    _settle(document)


def _settle(document: Document) -> None:
    """Replace the document's reservation, if it holds one, with the tokens it spent."""
    if document.reservation_id is None:
        return
    reservation = Reservation.objects.filter(pk=document.reservation_id).first()
    if reservation is not None:
        tokens = document.embedding_tokens
        cost = embedding_cost(model=embedder().model_name, tokens=tokens)
        budget_settle(reservation=reservation, actual=tokens, cost=cost)


@_failing_the_document
def _index(document_id: int) -> None:
    with transaction.atomic():
        document = document_claim(document_id, Stage.INDEX)
        if document is None:
            return
        chunks = Chunk.objects.filter(document=document).only("pk", "embedding")
        ids, vectors = chunk_vectors(chunks)

        collection_index_append(
            collection_id=document.collection_id,
            ids=ids,
            vectors=vectors,
            tombstones=ids,  # a re-delivered stage must not add twice
        )
        _advance(document, Stage.DONE, indexed_at=timezone.now())


STAGE_FUNCTIONS: dict[str, Callable[..., None]] = {
    Stage.PARSE: _parse,
    Stage.CHUNK: _chunk,
    Stage.EMBED: _embed,
    Stage.INDEX: _index,
}
