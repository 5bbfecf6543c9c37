"""Celery tasks: an interface that calls a service, nothing more."""

from __future__ import annotations

from celery import shared_task

from apps.chat.services.retention import retention_purge
from apps.chat.services.sweep import messages_close_abandoned


@shared_task
def messages_close_abandoned_task() -> int:
    return messages_close_abandoned()


@shared_task
def retention_purge_task() -> int:
    """How many messages were purged (counts only: a task's result never holds content)."""
    return sum(purged.messages for purged in retention_purge().values())
