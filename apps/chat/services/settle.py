"""What an answer leaves behind: its two messages, its usage block and its ledger row.

The question and the (streaming) answer are written once the first token is out
(:func:`messages_create`), with keys taken ahead (:class:`AnswerKeys`). However the answer
ends, :func:`settlement_write` takes its usage block (made by
:mod:`~apps.chat.services.answer_usage`), settles the reservation, writes the ledger row
and completes the message, in one transaction.
:class:`~apps.chat.services.run.AnswerRun` calls each of them once.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from apps.chat.models import Conversation, Message
from apps.chat.services.conversations import conversation_create
from apps.chat.services.prepare import PreparedAnswer
from apps.chat.services.types import Failed
from apps.core.exceptions import ApplicationError
from apps.core.ids import key_next
from apps.usage.budgets import budget_settle, reservation_record
from apps.usage.models import UsageRecord
from apps.usage.services import usage_cost, usage_record_chat
from apps.usage.values import Usage
from inference import ModelEntry
from inference.energy import Measured


@dataclass(frozen=True)
class AnswerKeys:
    """The primary keys of the answer's rows, known before they are written."""

    message_id: int
    conversation_id: int
    question_id: int
    """The user's message (0 for an answer not stored); below ``message_id``."""

    @classmethod
    async def take(cls, prepared: PreparedAnswer) -> AnswerKeys:
        conversation = prepared.conversation
        if conversation is not None:
            conversation_id = conversation.pk
        else:  # a new one, unless nothing is stored (0: none)
            conversation_id = await key_next(Conversation) if prepared.store else 0
        question_id = await key_next(Message) if prepared.store else 0
        return cls(
            message_id=await key_next(Message),
            conversation_id=conversation_id,
            question_id=question_id,
        )


@dataclass(frozen=True, kw_only=True)
class Ending:
    """How an answer ended, as its settlement records it."""

    status: str
    """A ``Message.Status``."""
    usage: Usage
    text: str
    reasoning: str
    finish_reason: str
    served: ModelEntry
    """The alias that served (or was last tried)."""
    route_reason: str = ""
    """Why it served (:mod:`.routing`)."""
    upstream: str
    """The upstream that served ("" for an answer replayed from the response cache)."""
    error: ApplicationError | None = None
    detached_unread_tokens: int = 0
    """Tokens made while its client was gone and never read (:mod:`.detach`)."""
    energy: Measured | None = None
    """Its share of what the energy counter measured (None: the table estimates it)."""


class ConversationGone(Exception):
    """The answer's conversation was deleted while the answer ran: its rows are not
    written, and the answer stops (its usage is still billed)."""


def messages_create(prepared: PreparedAnswer, keys: AnswerKeys) -> None:
    """The question and the (streaming) answer, in one insert, with their keys taken
    ahead. Called through the one writer: all or nothing. Raises
    :class:`ConversationGone` before writing anything if the conversation was deleted: its
    row is updated first, so a delete under way waits for this write (or this write sees
    it done), and no row ever points at a missing conversation."""
    caller, team = prepared.caller, prepared.caller.team
    conversation = prepared.conversation
    if conversation is not None:
        touched = Conversation.objects.filter(pk=conversation.pk).update(updated_at=timezone.now())
        if not touched:
            raise ConversationGone(conversation.pk)
    if prepared.reservation is not None:
        reservation_record(reservation=prepared.reservation)
    if conversation is None:
        conversation = conversation_create(caller=caller, title="openai", key=keys.conversation_id)
    question = Message(
        pk=keys.question_id,
        conversation=conversation,
        team=team,
        role=Message.Role.USER,
        content=prepared.question,
    )
    answer = Message(
        pk=keys.message_id,
        conversation=conversation,
        team=team,
        role=Message.Role.ASSISTANT,
        status=Message.Status.STREAMING,
        citations=prepared.citations,
        model=prepared.spec.alias,
        served_model=prepared.spec.served_name,
    )
    Message.objects.bulk_create([question, answer])  # created_at in this order, one insert


LEDGER_STATUS: dict[str, UsageRecord.Status] = {
    Message.Status.COMPLETE: UsageRecord.Status.OK,
    Message.Status.FAILED: UsageRecord.Status.ERROR,
    Message.Status.CANCELLED: UsageRecord.Status.CANCELLED,
}


def settlement_write(
    prepared: PreparedAnswer, keys: AnswerKeys, ending: Ending, *, rows_written: bool
) -> bool:
    """The settled reservation, the ledger row and the message, together (in one
    transaction, shared with other answers': :mod:`apps.core.group_commit`). An answer
    whose rows were not written (the client left at once, the database failed) writes
    them. Whether the message is stored: False for an answer not to be stored, or whose
    conversation was deleted meanwhile (its usage is billed all the same)."""
    usage, message_id, stored = ending.usage, keys.message_id, prepared.store
    if stored and not rows_written and not Message.objects.filter(pk=message_id).exists():
        try:
            messages_create(prepared, keys)
        except ConversationGone:
            stored = False
    caller = prepared.caller
    error = ending.error
    served = ending.served
    if prepared.reservation is not None:
        cost = usage_cost(model=served.alias, usage=usage, price=served.price)
        budget_settle(reservation=prepared.reservation, actual=usage.total_tokens, cost=cost)
    usage_record_chat(
        team=caller.team,
        api_key=caller.api_key,
        user=caller.user,
        model=served.alias,
        requested_model=prepared.requested or prepared.spec.alias,
        route_reason=ending.route_reason,
        upstream=ending.upstream,
        price=served.price,
        energy=served.energy,
        measured=ending.energy,
        usage=usage,
        status=LEDGER_STATUS[ending.status],
        error_code=error.code if error else "",
        object_id=str(message_id),
        detached_unread_tokens=ending.detached_unread_tokens,
        tag=caller.tag,
    )
    if not stored:
        return False  # the ledger row only: tokens and cost, no content
    return bool(
        Message.objects.filter(pk=message_id).update(
            content=ending.text,
            reasoning=ending.reasoning,
            status=ending.status,
            error=Failed(error=error).data() if error is not None else None,
            finish_reason=ending.finish_reason,
            usage_source=usage.source,
            model=served.alias,
            served_model=served.model,
            **usage.columns(),
        )
    )
