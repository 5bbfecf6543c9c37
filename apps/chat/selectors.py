"""Reads for the chat app, scoped to a team (another team's object is a 404)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from apps.accounts.models import Team
from apps.chat.models import Conversation, Message
from apps.core.exceptions import NotFound
from apps.usage.values import USAGE_COLUMNS, Usage


def conversation_list(*, team: Team) -> QuerySet[Conversation]:
    return Conversation.objects.filter(team=team).order_by("-updated_at", "-pk")


def conversation_get(*, team: Team, conversation_id: int) -> Conversation:
    conversation = Conversation.objects.filter(team=team, pk=conversation_id).first()
    if conversation is None:
        raise NotFound(f"No conversation {conversation_id}.")
    return conversation


def message_get(*, team: Team, message_id: int) -> Message:
    message = Message.objects.filter(team=team, pk=message_id).first()
    if message is None:
        raise NotFound(f"No message {message_id}.")
    return message


@dataclass(frozen=True)
class MessageState:
    status: str
    finish_reason: str
    error: dict[str, Any] | None
    age_seconds: float


def message_state(*, message_id: int) -> MessageState:
    """How an answer stands, for a replay following it."""
    row = Message.objects.filter(pk=message_id).values(
        "status", "finish_reason", "error", "created_at"
    )[0]
    age = (timezone.now() - row.pop("created_at")).total_seconds()
    return MessageState(**row, age_seconds=age)


def message_usage(*, message: Message) -> Usage:
    """An assistant message's usage block, as its answer reported it."""
    return Usage(
        **{name: getattr(message, name) for name in USAGE_COLUMNS},
        model=message.model,
        source="upstream" if message.usage_source == "upstream" else "counted",
    )
