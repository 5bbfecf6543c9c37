"""What the chat API answers with, shared by its views: conversations, messages with
their usage, an answer collected whole."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.chat.models import Conversation, Message
from apps.chat.services import CollectedAnswer


class UsageOutput(serializers.Serializer[Any]):
    """An answer's usage block (the ``usage`` event's data): ``prompt_tokens`` includes
    ``cached_tokens``, ``completion_tokens`` includes ``reasoning_tokens``."""

    prompt_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField(
        help_text="prompt tokens served from the tier's prefix cache of this team's own "
        "earlier prompts (vLLM, salted per team); 0 from any other server"
    )
    completion_tokens = serializers.IntegerField()
    reasoning_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()
    ttft_ms = serializers.IntegerField(allow_null=True)
    duration_ms = serializers.IntegerField(allow_null=True)
    tokens_per_second = serializers.FloatField(allow_null=True)
    queue_ms = serializers.IntegerField()
    model = serializers.CharField(allow_blank=True, help_text="the alias that served")
    # A field: DRF's metaclass takes it off the class, so it never shadows Field.source.
    source = serializers.CharField(  # type: ignore[assignment]
        allow_blank=True, help_text="upstream or counted"
    )
    cache_hit = serializers.BooleanField(
        help_text="answered by the response cache: the tier was not called and no "
        "generation token was charged (all token counts 0; ttft_ms is the replay's)"
    )


class MessageOutput(serializers.ModelSerializer[Message]):
    usage = serializers.SerializerMethodField()

    class Meta:
        model = Message
        fields = [
            "id",
            "role",
            "content",
            "citations",
            "status",
            "finish_reason",
            "model",
            "usage",
            "created_at",
        ]

    @extend_schema_field(UsageOutput(allow_null=True))
    def get_usage(self, message: Message) -> dict[str, Any] | None:
        if message.role != Message.Role.ASSISTANT:
            return None
        return {
            "prompt_tokens": message.prompt_tokens,
            "cached_tokens": message.cached_tokens,
            "completion_tokens": message.completion_tokens,
            "reasoning_tokens": message.reasoning_tokens,
            "total_tokens": message.prompt_tokens + message.completion_tokens,
            "ttft_ms": message.ttft_ms,
            "duration_ms": message.duration_ms,
            "tokens_per_second": message.tokens_per_second,
            "queue_ms": message.queue_ms,
            "model": message.model,
            "source": message.usage_source,
            "cache_hit": message.cache_hit,
        }


class ConversationOutput(serializers.ModelSerializer[Conversation]):
    collections = serializers.JSONField(source="collection_ids")

    class Meta:
        model = Conversation
        fields = ["id", "title", "collections", "created_at", "updated_at"]


class ConversationDetailOutput(ConversationOutput):
    messages = MessageOutput(many=True)

    class Meta(ConversationOutput.Meta):
        fields = [*ConversationOutput.Meta.fields, "messages"]


class AnswerOutput(serializers.Serializer[CollectedAnswer]):
    id = serializers.IntegerField(source="message_id")
    content = serializers.CharField()
    citations = serializers.JSONField()
    usage = UsageOutput(allow_null=True)
    finish_reason = serializers.CharField()
