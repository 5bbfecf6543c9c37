"""Celery tasks: an interface that calls a service, nothing more."""

from __future__ import annotations

from celery import shared_task

from apps.core.idempotency import idempotency_keys_purge_expired


@shared_task
def idempotency_keys_purge_task() -> int:
    return idempotency_keys_purge_expired()
