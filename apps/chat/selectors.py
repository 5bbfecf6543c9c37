"""Reads for the chat app, scoped to a team (another team's object is a 404)."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.accounts.models import Team
from apps.chat.models import Conversation, Message
from apps.core.exceptions import NotFound


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


def message_is_streaming(*, message_id: int) -> bool:
    return Message.objects.filter(pk=message_id, status=Message.Status.STREAMING).exists()
