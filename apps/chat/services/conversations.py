"""Writes for conversations and messages (other than answering)."""

from __future__ import annotations

import time

from django.db import transaction
from django.db.models import QuerySet

from apps.accounts.selectors import Caller
from apps.chat.event_store import event_buffers_delete
from apps.chat.models import Conversation, Message, MessageEvent
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


ANSWER_STOP_SECONDS = 5.0
"""The longest a delete waits for the conversation's running answers to stop and settle
(the process streaming one reads cancel requests every quarter second); past it (that
process died), the delete goes on, and the answer, if it still runs, stops alone."""


def conversation_delete(*, conversation: Conversation) -> None:
    """The conversation, its messages and their events, in the database and in Redis, and
    the team's cached answers (one of them may be this conversation's).

    An answer still running in it is stopped first, and billed for what it generated; its
    events and its settlement are all written before anything is deleted, and nothing of it
    after. An answer that had written nothing yet (queued at the tier) finds the
    conversation gone when it does, and stops (:class:`~.settle.ConversationGone`)."""
    team_id = conversation.team_id
    answers_stop(messages=conversation.messages.all())
    # The bulk of it (the answers' events) before the lock below: an answer's rows for
    # this conversation, written in a batch shared with other teams, wait on that lock.
    MessageEvent.objects.filter(message__conversation=conversation).delete()
    with transaction.atomic():
        # Locked first: an answer's rows written meanwhile wait for this delete, then
        # find the conversation gone, instead of pointing at a deleted row.
        Conversation.objects.select_for_update().filter(pk=conversation.pk).exists()
        message_ids = list(conversation.messages.values_list("pk", flat=True))
        conversation.delete()
        transaction.on_commit(lambda: event_buffers_delete(message_ids=message_ids))
        transaction.on_commit(lambda: response_cache_purge(team_id=team_id))


def answers_stop(*, messages: QuerySet[Message], wait: float = ANSWER_STOP_SECONDS) -> None:
    """Ask every answer streaming among ``messages`` to stop, and wait until each has
    settled (its message no longer ``streaming`` or ``detached``) or ``wait`` seconds have
    passed."""
    running = messages.filter(status__in=Message.RUNNING)
    if not running.update(cancel_requested=True):
        return
    deadline = time.monotonic() + wait
    while running.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def message_cancel(*, message: Message) -> Message:
    """Ask the process streaming this answer (read or detached) to stop; it bills what was
    generated."""
    if message.status in Message.RUNNING:
        Message.objects.filter(pk=message.pk).update(cancel_requested=True)
        message.cancel_requested = True
    return message
