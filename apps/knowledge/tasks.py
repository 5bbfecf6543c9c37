"""Celery tasks: an interface that takes ids and calls a service, nothing more."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from apps.knowledge.services import STAGE_FUNCTIONS, documents_requeue_stalled

# Transient: the database restarting or a connection dropped. Everything else is a bug or
# a bad document, and retrying it would only repeat the failure.
TRANSIENT = (OperationalError, InterfaceError)
RETRY = {"autoretry_for": TRANSIENT, "retry_backoff": True, "retry_jitter": True, "max_retries": 5}


@shared_task(**RETRY)
def document_parse(document_id: int) -> None:
    STAGE_FUNCTIONS["parse"](document_id=document_id)


@shared_task(**RETRY)
def document_chunk(document_id: int) -> None:
    STAGE_FUNCTIONS["chunk"](document_id=document_id)


@shared_task(**RETRY)
def document_embed(document_id: int) -> None:
    STAGE_FUNCTIONS["embed"](document_id=document_id)


@shared_task(**RETRY)
def document_index(document_id: int) -> None:
    STAGE_FUNCTIONS["index"](document_id=document_id)


@shared_task
def documents_requeue_stalled_task() -> None:
    documents_requeue_stalled()
