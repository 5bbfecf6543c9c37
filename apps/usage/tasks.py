"""Celery tasks: an interface that calls a service, nothing more."""

from __future__ import annotations

from celery import shared_task

from apps.usage.budgets import reservations_release_expired


@shared_task
def reservations_release_expired_task() -> None:
    reservations_release_expired()
