"""Retention: what a team keeps of its conversations, and for how long.

A team with ``retention_days`` set loses, every hour, the messages older than that (their
answer events with them, in the database and in Redis) and the conversations with no
message since. Answers still streaming are left to finish. Usage ledger rows are kept:
they carry tokens and cost, never content.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Team
from apps.chat.events import event_buffers_delete
from apps.chat.models import Conversation, Message, MessageEvent

PURGE_BATCH = 1000


@dataclass(frozen=True)
class Purged:
    conversations: int = 0
    messages: int = 0
    events: int = 0
    buffers: int = 0

    def __add__(self, other: Purged) -> Purged:
        return Purged(
            conversations=self.conversations + other.conversations,
            messages=self.messages + other.messages,
            events=self.events + other.events,
            buffers=self.buffers + other.buffers,
        )


def conversations_purge(*, team: Team, older_than: datetime) -> Purged:
    """Delete ``team``'s messages created before ``older_than`` and its conversations with
    no activity since, in batches (each its own transaction)."""
    purged = Purged()
    old = Message.objects.filter(team=team, created_at__lt=older_than).exclude(
        status=Message.Status.STREAMING
    )
    while ids := list(old.values_list("pk", flat=True)[:PURGE_BATCH]):
        with transaction.atomic():
            _, counts = Message.objects.filter(pk__in=ids).delete()
        purged += Purged(
            messages=counts.get(Message._meta.label, 0),
            events=counts.get(MessageEvent._meta.label, 0),
            buffers=event_buffers_delete(message_ids=ids),
        )
    idle = Conversation.objects.filter(team=team, updated_at__lt=older_than).exclude(
        messages__status=Message.Status.STREAMING
    )
    while ids := list(idle.values_list("pk", flat=True)[:PURGE_BATCH]):
        with transaction.atomic():
            message_ids = list(
                Message.objects.filter(conversation_id__in=ids).values_list("pk", flat=True)
            )
            _, counts = Conversation.objects.filter(pk__in=ids).delete()
        purged += Purged(
            conversations=counts.get(Conversation._meta.label, 0),
            messages=counts.get(Message._meta.label, 0),
            events=counts.get(MessageEvent._meta.label, 0),
            buffers=event_buffers_delete(message_ids=message_ids),
        )
    return purged


def retention_purge(*, now: datetime | None = None) -> dict[str, Purged]:
    """Apply every team's ``retention_days``; what was purged, by team name."""
    now = now or timezone.now()
    purged: dict[str, Purged] = {}
    for team in Team.objects.filter(retention_days__isnull=False):
        assert team.retention_days is not None  # noqa: S101 - filtered above
        cutoff = now - timedelta(days=team.retention_days)
        purged[team.name] = conversations_purge(team=team, older_than=cutoff)
    return purged
