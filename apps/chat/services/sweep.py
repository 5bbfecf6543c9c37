"""Answers left ``streaming`` by a process that stopped (killed, crashed, redeployed).

No answer can stream longer than :func:`answer_longest_seconds`: past it, the process that
ran it is gone. The periodic sweep closes such messages as failed (``answer_abandoned``),
so that lists and replays show how they ended; their reservations expire on their own
(:func:`apps.usage.budgets.reservations_release_expired`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from apps.chat.models import Message
from apps.chat.services.types import Failed
from apps.core.exceptions import ApplicationError

GRACE_SECONDS = 60.0


class AnswerAbandoned(ApplicationError):
    status, type, code = 500, "server_error", "answer_abandoned"


def answer_longest_seconds() -> float:
    """The longest an answer can stream: the queue wait, then the tier's total timeout."""
    total = float(settings.INFERENCE_TIMEOUTS["total"])
    return float(settings.INFERENCE_QUEUE_TIMEOUT) + total + GRACE_SECONDS


def abandoned_error() -> dict[str, object]:
    error = AnswerAbandoned("The answer stopped: the process serving it ended.")
    return Failed(error=error).data()


def messages_close_abandoned(*, now: datetime | None = None) -> int:
    """Close every answer still running past the longest possible answer."""
    cutoff = (now or timezone.now()) - timedelta(seconds=answer_longest_seconds())
    running = Message.objects.filter(status__in=Message.RUNNING, created_at__lt=cutoff)
    return running.update(
        status=Message.Status.FAILED, finish_reason="error", error=abandoned_error()
    )
