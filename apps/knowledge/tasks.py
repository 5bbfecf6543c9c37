"""Celery tasks: an interface that takes ids and calls a service, nothing more."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from apps.knowledge.services.ingestion import documents_requeue_stalled, ingestion_stage_run

# Transient: the database restarting or a connection dropped. Everything else is a bug or
# a bad document, and retrying it would only repeat the failure.
TRANSIENT = (OperationalError, InterfaceError)
STAGE_TASK = {
    "autoretry_for": TRANSIENT,
    "retry_backoff": True,
    "retry_jitter": True,
    "max_retries": 5,
    # Past the hard time limit the pool kills the child; the message goes back to the
    # queue like one whose worker died, so that the lost delivery is counted and the
    # document quarantined at the limit, rather than acknowledged and left "processing".
    "acks_on_timeout": False,
}


@shared_task(**STAGE_TASK)
def document_parse(document_id: int) -> None:
    ingestion_stage_run(document_id=document_id, stage="parse")


@shared_task(**STAGE_TASK)
def document_chunk(document_id: int) -> None:
    ingestion_stage_run(document_id=document_id, stage="chunk")


@shared_task(**STAGE_TASK)
def document_embed(document_id: int) -> None:
    ingestion_stage_run(document_id=document_id, stage="embed")


@shared_task(**STAGE_TASK)
def document_index(document_id: int) -> None:
    ingestion_stage_run(document_id=document_id, stage="index")


@shared_task
def documents_requeue_stalled_task() -> None:
    documents_requeue_stalled()
