"""Writes for conversations and messages (other than answering)."""

from __future__ import annotations

from django.db import transaction

from apps.accounts.selectors import Caller
from apps.chat.events import event_buffers_delete
from apps.chat.models import Conversation, Message
from apps.chat.response_cache import response_cache_purge
from apps.knowledge.selectors import collection_list_readable


def conversation_create(
    *,
    caller: Caller,
    title: str = "",
    collection_ids: list[int] | None = None,
    key: int | None = None,
) -> Conversation:
    """``key``: a primary key taken ahead (:func:`apps.core.ids.key_next`), or a new one."""
    if collection_ids:
        collection_list_readable(team=caller.team, ids=collection_ids)  # 404 if not readable
    return Conversation.objects.create(
        pk=key,
        team=caller.team,
        user=caller.user,
        api_key=caller.api_key,
        title=title,
        collection_ids=collection_ids or None,
    )


def conversation_delete(*, conversation: Conversation) -> None:
    """The conversation, its messages and their events, in the database and in Redis, and
    the team's cached answers (one of them may be this conversation's)."""
    team_id = conversation.team_id
    with transaction.atomic():
        message_ids = list(conversation.messages.values_list("pk", flat=True))
        conversation.delete()
        transaction.on_commit(lambda: event_buffers_delete(message_ids=message_ids))
        transaction.on_commit(lambda: response_cache_purge(team_id=team_id))


def message_cancel(*, message: Message) -> Message:
    """Ask the process streaming this answer to stop; it bills what was generated."""
    if message.status == Message.Status.STREAMING:
        Message.objects.filter(pk=message.pk).update(cancel_requested=True)
        message.cancel_requested = True
    return message
