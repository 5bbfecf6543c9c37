"""Retention: what a team keeps of its conversations, and for how long.

A team with ``retention_days`` set loses, every hour, the messages older than that (their
answer events with them, in the database and in Redis), the conversations with no
message since, and the cached answers written before (which never live longer anyway:
their TTL is capped by the retention). Answers still streaming are left to finish. Usage
ledger rows are kept: they carry tokens and cost, never content.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Team
from apps.chat.event_store import event_buffers_delete
from apps.chat.models import Conversation, ConversationSummary, Message, MessageEvent
from apps.chat.response_cache import response_cache_expire, response_cache_purge
from apps.core.audit import SYSTEM, Actor, audit_record
from apps.core.models import AuditEvent

PURGE_BATCH = 1000
RETENTION_JOB = Actor.job("retention_purge")


@dataclass(frozen=True)
class Purged:
    conversations: int = 0
    messages: int = 0
    events: int = 0
    buffers: int = 0
    cached_answers: int = 0

    def __add__(self, other: Purged) -> Purged:
        return Purged(
            conversations=self.conversations + other.conversations,
            messages=self.messages + other.messages,
            events=self.events + other.events,
            buffers=self.buffers + other.buffers,
            cached_answers=self.cached_answers + other.cached_answers,
        )


def conversations_purge(
    *, team: Team, older_than: datetime, actor: Actor = SYSTEM, audit_empty: bool = True
) -> Purged:
    """Delete ``team``'s messages created before ``older_than`` and its conversations with
    no activity since, in batches (each its own transaction), and say so in the audit log
    (unless nothing went and ``audit_empty`` is off: the hourly job would flood it)."""
    purged = Purged()
    old = Message.objects.filter(team=team, created_at__lt=older_than).exclude(
        status__in=Message.RUNNING
    )
    while ids := list(old.values_list("pk", flat=True)[:PURGE_BATCH]):
        with transaction.atomic():
            # A summary holds what the purged turns said: it goes with them.
            ConversationSummary.objects.filter(conversation__messages__pk__in=ids).delete()
            _, counts = Message.objects.filter(pk__in=ids).delete()
        purged += Purged(
            messages=counts.get(Message._meta.label, 0),
            events=counts.get(MessageEvent._meta.label, 0),
            buffers=event_buffers_delete(message_ids=ids),
        )
    idle = Conversation.objects.filter(team=team, updated_at__lt=older_than).exclude(
        messages__status__in=Message.RUNNING
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
    cached = response_cache_purge(team_id=team.pk, older_than=older_than)
    purged = purged + Purged(cached_answers=cached)
    if audit_empty or purged != Purged():
        audit_record(
            action=AuditEvent.Action.PURGE,
            actor=actor,
            team=team,
            target=f"conversations before {older_than.isoformat()}",
            detail=asdict(purged),
        )
    return purged


def retention_purge(*, now: datetime | None = None) -> dict[str, Purged]:
    """Apply every team's ``retention_days``; what was purged, by team name. Expired
    cached answers of every team go too."""
    now = now or timezone.now()
    response_cache_expire()
    purged: dict[str, Purged] = {}
    for team in Team.objects.filter(retention_days__isnull=False):
        assert team.retention_days is not None  # noqa: S101 - filtered above
        cutoff = now - timedelta(days=team.retention_days)
        purged[team.name] = conversations_purge(
            team=team, older_than=cutoff, actor=RETENTION_JOB, audit_empty=False
        )
    return purged
