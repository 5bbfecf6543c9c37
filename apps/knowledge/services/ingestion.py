"""How a worker runs one stage of a document (:mod:`.stages`), and what follows it.

A worker runs each stage under Celery's soft and hard time limits. Past the soft one the
document fails with ``time_limit_exceeded``. A stage that kills its worker process (a crash,
the kernel's OOM killer, the hard time limit) is delivered again, and every such lost
delivery is counted on the document before the stage starts: at
``DOCUMENT_MAX_LOST_DELIVERIES`` the document is quarantined as failed with
``worker_crashed`` instead of being run once more. When a stage ends, its place with the
workers goes back to the fair dispatcher (:mod:`.dispatch`).
"""

from __future__ import annotations

import time
from datetime import timedelta

from celery import current_app
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.knowledge.models import Document
from apps.knowledge.services.dispatch import (
    ingestion_dispatch,
    ingestion_enqueue,
    ingestion_send_if_past,
    ingestion_send_next,
    ingestion_share_add,
)
from apps.knowledge.services.stages import (
    ACTIVE,
    STAGE_FUNCTIONS,
    Stage,
    document_claim,
    document_fail,
)


def ingestion_stage_run(*, document_id: int, stage: str) -> None:
    """One delivery of one stage's task, as a worker runs it; then the next step.

    Counts the delivery as lost before the stage starts and clears the count when it
    finishes in any way the process survives, so only deliveries that died with their
    process remain counted; at the limit the document is quarantined without running the
    stage again. The time the stage took is added to the document's worker seconds, and
    its place goes back to the dispatcher: to the document's next stage (or the rest of an
    embed slice that ran out of time) if its team is next in turn, else to another team. A
    delivery for a stage the document has already left is handled as in a chain
    (:func:`~.dispatch.ingestion_send_if_past`).
    """
    lost = _delivery_begin(document_id, stage)
    if lost is None:
        ingestion_send_if_past(document_id, stage)
        ingestion_dispatch()  # a document deleted or failed meanwhile leaves a place free
        return
    if lost >= settings.DOCUMENT_MAX_LOST_DELIVERIES:
        document_fail(
            document_id=document_id,
            error=f"worker_crashed: the document is quarantined; the worker process died "
            f"{lost} times during its {stage} stage (crashed, out of memory, or past the "
            f"hard time limit of {current_app.conf.task_time_limit} s)",
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
            f"{current_app.conf.task_soft_time_limit} s",
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
    ingestion_send_next(document_id, stage)


def ingestion_stage_failed(*, document_id: int, stage: str, error: BaseException) -> None:
    """A stage's task gave up (an error it does not retry, or its retries ran out): the
    document fails with the error's kind, and its place goes to the next document at once,
    not at the stalled sweep."""
    document_fail(
        document_id=document_id,
        error=f"internal_error: the {stage} stage failed ({type(error).__name__}); "
        f"re-ingest the document to try again",
    )
    ingestion_dispatch()


def _delivery_begin(document_id: int, stage: str) -> int | None:
    """Count this delivery as lost until it finishes; the deliveries lost before it, or
    None when the document is no longer waiting for ``stage``."""
    with transaction.atomic():
        document = document_claim(document_id, stage)
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
    team_id = Document.objects.filter(pk=document_id).values_list("team_id", flat=True).first()
    if team_id is not None:
        ingestion_share_add(team_id=team_id, seconds=seconds)


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
