"""The summaries of a conversation's oldest turns, cached per conversation
(:class:`~apps.chat.models.ConversationSummary`): found by the turns they cover, claimed
before one is built (two answers never both build one of the same turns), completed, or
given up.

Every lookup names the team and the conversation, and each turn's mark is keyed by both
(an HMAC under the server's secret): a summary is never read or reused outside the
conversation it summarises.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from apps.chat.models import Conversation, ConversationSummary
from inference import ChatMessage

MARK_PURPOSE = "ragtier.chat.summary.turn"


@dataclass(frozen=True, slots=True)
class Summary:
    """A completed summary of the oldest ``covered`` history turns."""

    text: str
    covered: int


def marks_of(*, conversation: Conversation, turns: Sequence[ChatMessage]) -> list[str]:
    """A keyed hash of each of ``turns`` in ``conversation`` (its team's): what a summary
    is matched to the history by; an edited turn has another, a deleted one none."""
    prefix = f"{conversation.team_id}:{conversation.pk}:"
    return [_mark(f"{prefix}{turn['role']}:{turn['content']}") for turn in turns]


def _mark(value: str) -> str:
    return salted_hmac(MARK_PURPOSE, value, algorithm="sha256").hexdigest()[:32]


def covers_of(marks: Sequence[str]) -> str:
    """One hash of the ``marks`` of the turns a summary covers: its claim."""
    return hashlib.sha256("".join(marks).encode()).hexdigest()


def summary_find(
    *, conversation: Conversation, history: Sequence[ChatMessage], whole: bool = True
) -> Summary | None:
    """The conversation's completed summary whose covered turns are ``history``'s oldest as
    they are now, with how many of them; or None. ``whole``: ``history`` starts at the
    conversation's start, so every covered turn must be there; else (the read was cut at
    ``HISTORY_MESSAGES``) the oldest covered turns may have left it, and those it still
    holds must be its oldest."""
    rows = ConversationSummary.objects.filter(
        team_id=conversation.team_id, conversation=conversation, completed_at__isnull=False
    ).order_by("-completed_at", "-pk")
    current = marks_of(conversation=conversation, turns=history)
    for row in rows:
        covered = _overlap(row.marks, current)
        if covered and (covered == len(row.marks) or not whole):
            return Summary(row.text, covered)
    return None


def _overlap(covered: Sequence[str], current: Sequence[str]) -> int:
    """The longest tail of ``covered`` that is the head of ``current``: the covered turns
    still read (0: none, or one of them changed)."""
    for length in range(min(len(covered), len(current)), 0, -1):
        if list(covered[len(covered) - length :]) == list(current[:length]):
            return length
    return 0


def summary_claim(
    *, conversation: Conversation, turns: Sequence[ChatMessage]
) -> ConversationSummary | None:
    """The row a summary of ``turns`` is built into, claimed; None when another answer
    holds that claim (and it is not stale) or the conversation is gone."""
    marks = marks_of(conversation=conversation, turns=turns)
    covers = covers_of(marks)
    stale = timezone.now() - timedelta(seconds=settings.SUMMARY_CLAIM_SECONDS)
    ConversationSummary.objects.filter(
        conversation=conversation, covers=covers, completed_at__isnull=True, created_at__lt=stale
    ).delete()  # a build whose process died
    try:
        with transaction.atomic():
            return ConversationSummary.objects.create(
                conversation=conversation,
                team_id=conversation.team_id,
                covered_turns=len(turns),
                covers=covers,
                marks=marks,
            )
    except IntegrityError:
        return None


def summary_complete(*, claim: ConversationSummary, text: str, tokens: int) -> bool:
    """The claimed row completed with ``text``; the conversation's older summaries go. False
    when the row is gone (the conversation was deleted meanwhile): nothing is left."""
    with transaction.atomic():
        done = ConversationSummary.objects.filter(pk=claim.pk).update(
            text=text, tokens=tokens, completed_at=timezone.now()
        )
        if done:
            ConversationSummary.objects.filter(
                conversation_id=claim.conversation_id, completed_at__isnull=False
            ).exclude(pk=claim.pk).delete()
    return bool(done)


def summary_release(*, claim: ConversationSummary) -> None:
    """A claim given up (the build failed): another answer may build it."""
    ConversationSummary.objects.filter(pk=claim.pk, completed_at__isnull=True).delete()
