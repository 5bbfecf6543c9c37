"""Writes for the chat app, one module per concern, re-exported here."""

from apps.chat.services.answers import AnswerEvent, PreparedAnswer, answer_events, answer_prepare
from apps.chat.services.collect import CollectedAnswer, answer_collect
from apps.chat.services.conversations import (
    conversation_create,
    conversation_delete,
    message_cancel,
)
from apps.chat.services.models import (
    ModelSpec,
    inference_client,
    model_aliases,
    model_resolve,
    tokenizer,
)

__all__ = [
    "AnswerEvent",
    "CollectedAnswer",
    "ModelSpec",
    "PreparedAnswer",
    "answer_collect",
    "answer_events",
    "answer_prepare",
    "conversation_create",
    "conversation_delete",
    "inference_client",
    "message_cancel",
    "model_aliases",
    "model_resolve",
    "tokenizer",
]
