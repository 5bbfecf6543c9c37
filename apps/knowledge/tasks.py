"""Celery tasks: an interface that takes ids and calls a service, nothing more."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from billiard.einfo import ExceptionInfo
from celery import Task, shared_task
from celery.exceptions import TimeLimitExceeded, WorkerLostError
from django.conf import settings
from django.db import InterfaceError, OperationalError

from apps.knowledge.backends.base import IndexUnavailable
from apps.knowledge.backends.faiss import collection_index_compact, collections_compact
from apps.knowledge.services.ingestion import (
    documents_requeue_stalled,
    ingestion_stage_failed,
    ingestion_stage_run,
)
from apps.usage.budgets import AdmissionUnavailable

# Transient: the database restarting or a connection dropped, the quota store out of reach.
# Everything else is a bug or a bad document, and retrying it would only repeat the failure.
TRANSIENT = (OperationalError, InterfaceError, AdmissionUnavailable, IndexUnavailable)


class StageTask(Task[[int], None]):
    """A stage's task that gives up (an error it does not retry, or its last retry)
    fails its document and hands its place on, rather than hold it until the sweep."""

    def on_failure(
        self,
        exc: Exception,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        einfo: ExceptionInfo,
    ) -> None:
        if isinstance(exc, TimeLimitExceeded | WorkerLostError):
            return  # the process was killed: a lost delivery, counted when it comes again
        stage = self.name.rpartition("_")[2]
        ingestion_stage_failed(document_id=int(args[0]), stage=stage, error=exc)


STAGE_TASK: dict[str, Any] = {
    "base": StageTask,
    "autoretry_for": TRANSIENT,
    "retry_backoff": True,
    "retry_jitter": True,
    "max_retries": 5,
    # Past the hard time limit the pool kills the child; the message goes back to the
    # queue like one whose worker died, so that the lost delivery is counted and the
    # document quarantined at the limit, rather than acknowledged and left "processing".
    "acks_on_timeout": False,
}
stage_task: Callable[[Callable[[int], None]], Task[[int], None]] = shared_task(**STAGE_TASK)


@stage_task
def document_parse(document_id: int) -> None:
    ingestion_stage_run(document_id=document_id, stage="parse")


@stage_task
def document_chunk(document_id: int) -> None:
    ingestion_stage_run(document_id=document_id, stage="chunk")


@stage_task
def document_embed(document_id: int) -> None:
    ingestion_stage_run(document_id=document_id, stage="embed")


@stage_task
def document_index(document_id: int) -> None:
    ingestion_stage_run(document_id=document_id, stage="index")


@shared_task
def documents_requeue_stalled_task() -> None:
    documents_requeue_stalled()


# A compaction may rebuild a large graph (HNSW takes minutes past 1M vectors: see
# docs/scaling.md), far past an ingestion stage's limits; a killed one leaves only an
# orphan file.
@shared_task(
    autoretry_for=TRANSIENT,
    retry_backoff=True,
    retry_jitter=True,
    max_retries=5,
    time_limit=settings.INDEX_COMPACT_TIME_LIMIT,
    soft_time_limit=settings.INDEX_COMPACT_TIME_LIMIT - 30,
)
def collection_index_compact_task(collection_id: int) -> None:
    collection_index_compact(collection_id=collection_id)


@shared_task(
    time_limit=settings.INDEX_COMPACT_TIME_LIMIT,
    soft_time_limit=settings.INDEX_COMPACT_TIME_LIMIT - 30,
)
def indexes_compact_task() -> None:
    collections_compact()
