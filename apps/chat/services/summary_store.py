"""The summaries of a conversation's oldest turns, cached per conversation
(:class:`~apps.chat.models.ConversationSummary`): found by the turns they cover, claimed
before one is built (two answers never both build one of the same turns), completed, or
given up.

Every lookup names the team and the conversation, and ``covers`` is keyed by both: a
summary is never read or reused outside the conversation it summarises.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from apps.chat.models import Conversation, ConversationSummary
from inference import ChatMessage

COVERS_PURPOSE = "ragtier.chat.summary.covers"


@dataclass(frozen=True, slots=True)
class Summary:
    """A completed summary of the oldest ``covered`` history turns."""

    text: str
    covered: int


def covers_of(*, conversation: Conversation, turns: Sequence[ChatMessage]) -> str:
    """The keyed hash of ``turns`` in ``conversation`` (its team's): what a summary of them
    is found by; any change to them (an edit, a delete) is another hash."""
    pairs = [[turn["role"], turn["content"]] for turn in turns]
    value = f"{conversation.team_id}:{conversation.pk}:" + json.dumps(pairs, ensure_ascii=False)
    return salted_hmac(COVERS_PURPOSE, value, algorithm="sha256").hexdigest()


def summary_find(*, conversation: Conversation, history: Sequence[ChatMessage]) -> Summary | None:
    """The conversation's completed summary covering the most of ``history``'s oldest turns
    as they are now, or None."""
    rows = ConversationSummary.objects.filter(
        team_id=conversation.team_id, conversation=conversation, completed_at__isnull=False
    ).order_by("-covered_turns")
    for row in rows:
        covered = row.covered_turns
        if covered <= len(history) and row.covers == covers_of(
            conversation=conversation, turns=history[:covered]
        ):
            return Summary(row.text, covered)
    return None


def summary_claim(
    *, conversation: Conversation, turns: Sequence[ChatMessage]
) -> ConversationSummary | None:
    """The row a summary of ``turns`` is built into, claimed; None when another answer
    holds that claim (and it is not stale) or the conversation is gone."""
    covers = covers_of(conversation=conversation, turns=turns)
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
