"""The ingestion pipeline: parse → chunk → embed → index, one idempotent stage at a time.

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

The workers get stages from a fair dispatcher, not first come first served: a document
waits in its team's line, and each place among the ``INGEST_MAX_IN_FLIGHT`` stages the
workers hold goes to the team with the fewest there, then to the team that has used the
workers least since its line began (:func:`_used_lately`), then to the one waiting
longest. When a stage ends, the document's next stage follows at once unless another
team is waiting that has used the workers less, by more than
``INGEST_FAIR_QUANTUM_SECONDS``; then the place goes back to the dispatcher. So one
team's backlog, or its files that take long to parse, stand in front of another team's
document for about the stage already running; the embed stage works in slices of
``INGEST_EMBED_SLICE_SECONDS``, so a long document neither outlasts the time limit nor
holds a worker while other teams wait.

A worker runs each stage under Celery's soft and hard time limits. Past the soft one the
document fails with ``time_limit_exceeded``. A stage that kills its worker process (a crash,
the kernel's OOM killer, the hard time limit) is delivered again, and every such lost
delivery is counted on the document before the stage starts: at
``DOCUMENT_MAX_LOST_DELIVERIES`` the document is quarantined as failed with
``worker_crashed`` instead of being run once more.
"""

from __future__ import annotations

import functools
import logging
import operator
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import PurePath

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Min, Q, QuerySet, Sum
from django.utils import timezone

from apps.core.crypto import decrypt_bytes
from apps.knowledge.models import Chunk, Document
from apps.knowledge.services.indexing import chunk_vectors, collection_index_append, embedder
from apps.usage.budgets import RateLimited, budget_reserve, budget_settle
from apps.usage.models import Reservation, UsageRecord
from apps.usage.services import usage_record_embedding
from config.celery import app as celery_app
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
TASKS = {stage: f"apps.knowledge.tasks.document_{stage}" for stage in STAGES}
PROGRESS = {Stage.PARSE: 0, Stage.CHUNK: 10, Stage.EMBED: 20, Stage.INDEX: 90, Stage.DONE: 100}
ACTIVE = (Document.Status.QUEUED, Document.Status.PROCESSING)


def ingestion_enqueue(*, document: Document) -> None:
    """Put the document in its team's line; the dispatcher sends it on after commit, from
    its current stage, when a place with the workers falls to its team."""
    now = timezone.now()
    Document.objects.filter(pk=document.pk).update(
        attempts=F("attempts") + 1,
        enqueued_at=now,
        dispatched_at=None,
        lost_deliveries=0,
        updated_at=now,
    )
    transaction.on_commit(ingestion_dispatch)


def ingestion_dispatch() -> list[int]:
    """Send waiting documents' next stages to the workers, taking turns between teams;
    the documents' ids.

    At most ``INGEST_MAX_IN_FLIGHT`` stages are with the workers at once (0, or tasks run
    eagerly: no cap, first come first served). Each free place goes to the team with the
    fewest stages there, then to the one that has used the workers least since its line
    began, then to the one waiting longest, and within a team to its oldest document.
    Called when a document joins the line, when a stage gives its place back, and by the
    periodic sweep. Two dispatchers at once never send a document twice (the hand-over is
    a conditional update), though they may overshoot the cap by the places they both saw
    free.
    """
    waiting = _waiting()
    cap = _cap()
    if cap <= 0:
        chosen = list(waiting.order_by("enqueued_at", "pk").values_list("pk", flat=True))
    else:
        in_flight = Document.objects.filter(status__in=ACTIVE, dispatched_at__isnull=False)
        chosen = _fair_choice(waiting, in_flight, places=cap - in_flight.count())
    now = timezone.now()
    sent: list[int] = []
    for document_id in chosen:
        if waiting.filter(pk=document_id).update(dispatched_at=now, updated_at=now):
            stage = Document.objects.filter(pk=document_id).values_list("stage", flat=True)[0]
            if stage in STAGES:
                _send(document_id, stage)
                sent.append(document_id)
    return sent


def _waiting() -> QuerySet[Document]:
    return Document.objects.filter(
        status__in=ACTIVE, enqueued_at__isnull=False, dispatched_at__isnull=True
    ).order_by()


def _cap() -> int:
    return 0 if celery_app.conf.task_always_eager else settings.INGEST_MAX_IN_FLIGHT


def _fair_choice(
    waiting: QuerySet[Document], in_flight: QuerySet[Document], *, places: int
) -> list[int]:
    """Up to ``places`` waiting documents, one at a time to the team with the fewest with
    the workers (counting those already chosen), then the one that has used them least
    since its line began, then the longest waiting."""
    if places <= 0:
        return []
    first_waiting = dict(
        waiting.values("team_id").annotate(first=Min("enqueued_at")).values_list("team_id", "first")
    )
    used = _used_lately(first_waiting)
    busy = Counter(
        dict(
            in_flight.order_by()
            .values("team_id")
            .annotate(n=Count("pk"))
            .values_list("team_id", "n")
        )
    )
    chosen: list[int] = []
    while first_waiting and len(chosen) < places:
        team_id = min(
            first_waiting,
            key=lambda team: (busy[team], used[team], first_waiting[team], team),
        )
        document_id = (
            waiting.filter(team_id=team_id)
            .exclude(pk__in=chosen)
            .order_by("enqueued_at", "pk")
            .values_list("pk", flat=True)
            .first()
        )
        if document_id is None:
            del first_waiting[team_id]
            continue
        chosen.append(document_id)
        busy[team_id] += 1
    return chosen


def _used_lately(team_ids: Iterable[int]) -> dict[int, float]:
    """Each team's worker seconds since its line began: on its documents touched since its
    oldest unfinished one joined the line, and within ``INGEST_FAIR_WINDOW_SECONDS``.

    What a team used before its present documents came is forgotten, as a fair queue
    forgets a flow that went idle: a team's new document is not held back for the
    documents it had indexed earlier, while a team that keeps the workers busy (a backlog,
    files that take long to parse or fail) keeps what it used against it.
    """
    teams = list(team_ids)
    window = timezone.now() - timedelta(seconds=settings.INGEST_FAIR_WINDOW_SECONDS)
    began = dict(
        Document.objects.filter(team_id__in=teams, status__in=ACTIVE)
        .order_by()
        .values("team_id")
        .annotate(first=Min("enqueued_at"))
        .values_list("team_id", "first")
    )
    used = dict.fromkeys(teams, 0.0)
    if not began:
        return used
    since = functools.reduce(
        operator.or_,
        (
            Q(team_id=team, updated_at__gte=max(first or window, window))
            for team, first in began.items()
        ),
    )
    used.update(
        Document.objects.filter(since)
        .order_by()
        .values("team_id")
        .annotate(seconds=Sum("worker_seconds"))
        .values_list("team_id", "seconds")
    )
    return used


def _send(document_id: int, stage: str) -> None:
    """Queue the task of ``stage`` for the document once the current transaction commits."""
    signature = celery_app.signature(TASKS[stage], args=[document_id], immutable=True)
    transaction.on_commit(functools.partial(signature.apply_async))


def ingestion_stage_run(*, document_id: int, stage: str) -> None:
    """One delivery of one stage's task, as a worker runs it; then the next step.

    Counts the delivery as lost before the stage starts and clears the count when it
    finishes in any way the process survives, so only deliveries that died with their
    process remain counted; at the limit the document is quarantined without running the
    stage again. The time the stage took is added to the document's worker seconds, and
    its place goes back to the dispatcher: to the document's next stage (or the rest of an
    embed slice that ran out of time) if its team is next in turn, else to another team. A
    delivery for a stage the document has already left is handled as in a chain
    (``_send_if_past``).
    """
    lost = _delivery_begin(document_id, stage)
    if lost is None:
        _send_if_past(document_id, stage)
        return
    if lost >= settings.DOCUMENT_MAX_LOST_DELIVERIES:
        document_fail(
            document_id=document_id,
            error=f"worker_crashed: the document is quarantined; the worker process died "
            f"{lost} times during its {stage} stage (crashed, out of memory, or past the "
            f"hard time limit of {celery_app.conf.task_time_limit} s)",
        )
        ingestion_dispatch()
        return
    options = {"slice_seconds": settings.INGEST_EMBED_SLICE_SECONDS} if stage == Stage.EMBED else {}
    started = time.monotonic()
    try:
        STAGE_FUNCTIONS[stage](document_id=document_id, **options)
    except SoftTimeLimitExceeded:
        document_fail(
            document_id=document_id,
            error=f"time_limit_exceeded: the {stage} stage ran past its time limit of "
            f"{celery_app.conf.task_soft_time_limit} s",
        )
    except MemoryError:
        document_fail(
            document_id=document_id,
            error=f"out_of_memory: the {stage} stage ran out of memory",
        )
    except Exception:
        # The process lives on: the task retries or gives up.
        _delivery_end(document_id, seconds=time.monotonic() - started)
        raise
    # Not for SystemExit and the like: the process is being terminated (the pool's hard
    # time limit sends SIGTERM before SIGKILL), and the delivery stays counted as lost.
    _delivery_end(document_id, seconds=time.monotonic() - started)
    _send_next(document_id, stage)


def _delivery_begin(document_id: int, stage: str) -> int | None:
    """Count this delivery as lost until it finishes; the deliveries lost before it, or
    None when the document is no longer waiting for ``stage``."""
    with transaction.atomic():
        document = _claim(document_id, stage)
        if document is None:
            return None
        lost = document.lost_deliveries
        document.lost_deliveries = lost + 1
        document.save(update_fields=["lost_deliveries", "updated_at"])
    return lost


def _delivery_end(document_id: int, *, seconds: float) -> None:
    Document.objects.filter(pk=document_id).update(
        lost_deliveries=0, worker_seconds=F("worker_seconds") + seconds
    )


def _send_if_past(document_id: int, stage: str) -> None:
    """A delivery of a stage the document has left, as a chain would handle it.

    The delivery that moved it on may have died between its commit and sending the next
    stage's task (this one is then its re-delivery): send that task. Had it been sent,
    the next stage finds the document further on as well and does the same, so a stale
    duplicate runs through to the stage the document is at, like the rest of a chain.
    Nothing for a document that is gone, failed, indexed, back at an earlier stage, or
    back in its team's line (the dispatcher sends it).
    """
    current = (
        Document.objects.filter(pk=document_id, status__in=ACTIVE, dispatched_at__isnull=False)
        .values_list("stage", flat=True)
        .first()
    )
    if current in STAGES and STAGES.index(current) > STAGES.index(stage):
        _send(document_id, STAGES[STAGES.index(stage) + 1])


def _send_next(document_id: int, stage: str) -> None:
    """After a stage: the document's next stage (or the rest of an embed slice) while its
    team keeps its turn; else its place back to the dispatcher, the document back in its
    team's line, ahead of the team's later documents. A document that has left the
    workers frees its place."""
    row = Document.objects.filter(pk=document_id).values_list("stage", "status", "team_id")
    document = row.first()
    if document is None or document[1] not in ACTIVE:
        ingestion_dispatch()
        return
    current, _, team_id = document
    if current == stage and stage != Stage.EMBED:
        return  # not moved on: it keeps its place until the stalled sweep
    if _keeps_its_turn(team_id):
        _send(document_id, current)
        return
    Document.objects.filter(pk=document_id, dispatched_at__isnull=False).update(dispatched_at=None)
    ingestion_dispatch()


def _keeps_its_turn(team_id: int) -> bool:
    """Whether a team's document goes on to its next stage at once: yes, unless another
    team is waiting that has used the workers less than this one, by more than
    ``INGEST_FAIR_QUANTUM_SECONDS`` (a small document then runs through, and a team that
    has used the workers for long gives way between stages)."""
    if _cap() <= 0:
        return True
    others = set(_waiting().exclude(team_id=team_id).values_list("team_id", flat=True))
    if not others:
        return True
    used = _used_lately({team_id, *others})
    return (
        used[team_id] <= min(used[team] for team in others) + settings.INGEST_FAIR_QUANTUM_SECONDS
    )


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


def _claim(document_id: int, stage: str) -> Document | None:
    """Like :func:`_peek`, with the row locked for the rest of the transaction."""
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
        document = _claim(document_id, Stage.PARSE)
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
        document = _claim(document_id, Stage.CHUNK)
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
                document = _claim(document_id, Stage.EMBED)
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
            document = _claim(document_id, Stage.EMBED)
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
            locked = _claim(document.pk, Stage.EMBED)
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
                team=locked.team, api_key=None, tokens=tokens, kind=UsageRecord.Kind.EMBEDDING
            )
            locked.save(update_fields=["reservation", "updated_at"])
            return True
    except RateLimited as exc:
        remaining = exc.headers.get("x-ratelimit-remaining-tokens", "?")
        document_fail(
            document_id=document.pk,
            error=f"{exc.code}: the team's embedding quota is spent (this document needs "
            f"{tokens} tokens, {remaining} remain); "
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
        model=embedder().model_name,
        tokens=document.embedding_tokens,
        operation="ingest",
        object_id=str(document.pk),
        status=status,
    )
    _settle(document)


def _settle(document: Document) -> None:
    """Replace the document's reservation, if it holds one, with the tokens it spent."""
    if document.reservation_id is None:
        return
    reservation = Reservation.objects.filter(pk=document.reservation_id).first()
    if reservation is not None:
        budget_settle(reservation=reservation, actual=document.embedding_tokens)


@_failing_the_document
def _index(document_id: int) -> None:
    with transaction.atomic():
        document = _claim(document_id, Stage.INDEX)
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


def documents_requeue_stalled() -> tuple[int, int]:
    """Re-queue documents whose stage has not moved for too long; fail them past the limit.
    Then let the dispatcher fill the places with the workers, should a hand-over have been
    lost (a process that died between its commit and the dispatch).

    Returns (re-queued, failed).
    """
    cutoff = timezone.now() - timedelta(seconds=settings.DOCUMENT_STALL_SECONDS)
    stalled = Document.objects.filter(status__in=ACTIVE, updated_at__lt=cutoff).exclude(
        enqueued_at__isnull=False,
        dispatched_at__isnull=True,  # waiting its turn, not stalled
    )
    requeued = failed = 0
    for document_id in list(stalled.values_list("pk", flat=True)):
        with transaction.atomic():
            document = stalled.select_for_update().filter(pk=document_id).first()
            if document is None:
                continue
            if document.attempts < settings.DOCUMENT_MAX_ATTEMPTS:
                ingestion_enqueue(document=document)
                requeued += 1
                continue
        failed += 1
        document_fail(
            document_id=document_id,
            error=f"ingestion stalled at stage {document.stage!r} "
            f"after {document.attempts} attempts",
        )
    ingestion_dispatch()
    return requeued, failed
