"""Reads for the chat app, scoped to a team (another team's object is a 404)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from apps.accounts.models import Team
from apps.chat.models import Conversation, Message
from apps.core.exceptions import NotFound
from apps.core.validation import MAX_ID
from apps.usage.values import USAGE_COLUMNS, Usage
from inference import ChatMessage


def conversation_list(*, team: Team) -> QuerySet[Conversation]:
    return Conversation.objects.filter(team=team).order_by("-updated_at", "-pk")


def conversation_get(*, team: Team, conversation_id: int) -> Conversation:
    conversation = Conversation.objects.filter(team=team, pk=conversation_id).first()
    if conversation is None:
        raise NotFound(f"No conversation {conversation_id}.")
    return conversation


_HISTORY_SQL = (
    "SELECT c.collection_ids, m.role, m.content FROM {conversations} c"
    " LEFT JOIN (SELECT role, content, created_at, id FROM {messages}"
    " WHERE conversation_id = %s AND status <> %s AND content <> ''"
    " ORDER BY created_at DESC, id DESC LIMIT %s) m ON 1 = 1"
    " WHERE c.id = %s AND c.team_id = %s ORDER BY m.created_at DESC, m.id DESC"
)


def conversation_history(
    *, team: Team, conversation_id: int, limit: int
) -> tuple[Conversation, list[ChatMessage]]:
    """The team's conversation (another team's is a 404) and its most recent completed
    turns, at most ``limit`` messages, oldest first and starting with a question: the one
    read an answer makes before the tier is called, in one query: through the ORM, compiling
    the SQL and building model instances cost more than the read (docs/gateway.md). The
    conversation comes with ``collection_ids``; its other fields load when read, as after
    ``only()``.

    An id past the database's integer is no conversation: the ORM's lookups say so
    themselves, raw SQL would raise."""
    if not 0 < conversation_id <= MAX_ID:
        raise NotFound(f"No conversation {conversation_id}.")
    conversations, messages = Conversation._meta, Message._meta
    tables = {"conversations": conversations.db_table, "messages": messages.db_table}
    sql = _HISTORY_SQL.format(**tables)
    params: list[int | str] = [
        conversation_id,
        Message.Status.STREAMING,
        limit,
        conversation_id,
        team.pk,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        raise NotFound(f"No conversation {conversation_id}.")
    collection_ids = conversations.get_field("collection_ids")
    content = messages.get_field("content")
    # No expression: JSONField reads one only to unwrap a key lookup.
    collections = collection_ids.from_db_value(rows[0][0], None, connection)  # type: ignore[arg-type]
    conversation = Conversation.from_db(
        connection.alias,
        ["id", "team_id", "collection_ids"],
        [conversation_id, team.pk, collections],
    )
    recent = [(role, text) for _, role, text in rows if role is not None]
    while recent and recent[-1][0] == Message.Role.ASSISTANT:
        recent.pop()  # a history starts with a question
    history: list[ChatMessage] = [
        {"role": role, "content": content.from_db_value(text, None, connection) or ""}
        for role, text in reversed(recent)
    ]
    return conversation, history


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


def message_state(*, message_id: int) -> MessageState | None:
    """How an answer stands, for a replay following it; None once it is deleted."""
    row = (
        Message.objects.filter(pk=message_id)
        .values("status", "finish_reason", "error", "created_at")
        .first()
    )
    if row is None:
        return None
    age = (timezone.now() - row["created_at"]).total_seconds()
    return MessageState(
        status=row["status"],
        finish_reason=row["finish_reason"],
        error=row["error"],
        age_seconds=age,
    )


def message_usage(*, message: Message) -> Usage:
    """An assistant message's usage block, as its answer reported it."""
    return Usage(
        **{name: getattr(message, name) for name in USAGE_COLUMNS},
        model=message.model,
        source="upstream" if message.usage_source == "upstream" else "counted",
    )
