"""What the chat API answers with, shared by its views: conversations, messages with
their usage, an answer collected whole, each answer event's data, and OpenAI's
``chat.completion``, its chunks and the model list. The ones the views do not render with
are the OpenAPI schema's components: they say what the wire functions
(:mod:`apps.chat.wire`) write, so that a conformance check can fail on it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.chat.models import Conversation, Message
from apps.chat.services import CollectedAnswer
from apps.core.schema import ConstantField, ErrorDetailSerializer

FINISH_REASONS = ["stop", "length", "content_filter", "tool_calls"]
"""What an OpenAI ``finish_reason`` can be (the native one is the answer's own)."""


class CitationOutput(serializers.Serializer[Any]):
    """A passage the prompt kept, numbered (``id``) as the prompt numbers it (``[1]``)."""

    id = serializers.IntegerField(help_text="the passage's number in the prompt, from 1")
    chunk_id = serializers.IntegerField()
    document_id = serializers.IntegerField()
    collection_id = serializers.IntegerField()
    title = serializers.CharField(allow_blank=True)
    chunk_index = serializers.IntegerField()
    score = serializers.FloatField()
    snippet = serializers.CharField(allow_blank=True)


@extend_schema_field(CitationOutput(many=True))
class CitationsField(serializers.JSONField):
    """Citations as the answer stored them (a list of :class:`CitationOutput`'s shape),
    written out as they are."""


@extend_schema_field(
    serializers.ListField(
        child=serializers.IntegerField(),
        allow_null=True,
        help_text="the collections it searches; null: all of the team's",
    )
)
class CollectionIdsField(serializers.JSONField):
    """A conversation's collection ids as stored (null: all of the team's)."""


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
    context_window = serializers.IntegerField(
        required=False, allow_null=True, help_text="the served model's window (usage event)"
    )
    dropped_passages = serializers.IntegerField(
        required=False, help_text="passages found that the window left out"
    )
    dropped_turns = serializers.IntegerField(
        required=False, help_text="history messages the window left out"
    )
    summarized_turns = serializers.IntegerField(
        required=False, help_text="history messages replaced by a summary"
    )
    dropped_tokens = serializers.IntegerField(
        required=False,
        help_text="the tokens the passages and turns left out or summarised would have taken",
    )
    tag = serializers.CharField(
        required=False, allow_blank=True, help_text="the purpose tag it is charged under"
    )


class MessageOutput(serializers.ModelSerializer[Message]):
    citations = CitationsField()
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
    collections = CollectionIdsField(source="collection_ids")

    class Meta:
        model = Conversation
        fields = ["id", "title", "collections", "created_at", "updated_at"]


class ConversationDetailOutput(ConversationOutput):
    messages = MessageOutput(many=True)

    class Meta(ConversationOutput.Meta):
        fields = [*ConversationOutput.Meta.fields, "messages"]


class TopLogprobOutput(serializers.Serializer[Any]):
    token = serializers.CharField(allow_blank=True)
    logprob = serializers.FloatField(help_text="natural log; -9999.0 for a token ruled out")
    bytes = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=255), allow_null=True
    )


class TokenLogprobOutput(TopLogprobOutput):
    """An answer token's log probability and the likeliest tokens at its position, in
    OpenAI's shape (``top_logprobs`` empty unless asked for)."""

    top_logprobs = TopLogprobOutput(many=True)


class ChoiceLogprobsOutput(serializers.Serializer[Any]):
    content = TokenLogprobOutput(many=True)


class AnswerOutput(serializers.Serializer[CollectedAnswer]):
    id = serializers.IntegerField(source="message_id")
    content = serializers.CharField()
    citations = CitationsField()
    usage = UsageOutput(allow_null=True)
    finish_reason = serializers.CharField()
    logprobs = TokenLogprobOutput(
        many=True, required=False, help_text="with logprobs: true, the answer tokens'"
    )


class StartedEventOutput(serializers.Serializer[Any]):
    """The ``message`` event: the first of every answer."""

    message_id = serializers.IntegerField()
    conversation_id = serializers.IntegerField()
    model = serializers.CharField(help_text="the alias that serves")


class RetrievalEventOutput(serializers.Serializer[Any]):
    """The ``retrieval`` event: the passages the prompt kept, before the first token."""

    citations = CitationOutput(many=True)


class TextEventOutput(serializers.Serializer[Any]):
    """The ``reasoning`` event (reasoning text)."""

    text = serializers.CharField(allow_blank=True)


class DeltaEventOutput(TextEventOutput):
    """The ``delta`` event (answer text; with ``logprobs: true``, its tokens')."""

    logprobs = TokenLogprobOutput(many=True, required=False)


class DoneEventOutput(serializers.Serializer[Any]):
    """The ``done`` event: always the last."""

    message_id = serializers.IntegerField()
    finish_reason = serializers.CharField(allow_blank=True)


ANSWER_EVENTS: dict[str, type[serializers.Serializer[Any]]] = {
    "message": StartedEventOutput,
    "retrieval": RetrievalEventOutput,
    "delta": DeltaEventOutput,
    "reasoning": TextEventOutput,
    "usage": UsageOutput,
    "error": ErrorDetailSerializer,
    "done": DoneEventOutput,
}
"""Each native answer event's name and the serializer of its data."""


class ToolCallFunctionOutput(serializers.Serializer[Any]):
    name = serializers.CharField(required=False)
    arguments = serializers.CharField(
        allow_blank=True, help_text="JSON text (in a chunk: the next piece of it)"
    )


class ToolCallOutput(serializers.Serializer[Any]):
    """A tool call the model made, in OpenAI's shape; in a chunk, ``index`` says which
    call a piece of ``arguments`` continues, and ``id``, ``type`` and ``name`` come first."""

    index = serializers.IntegerField(required=False, min_value=0, help_text="in chunks only")
    id = serializers.CharField(required=False)
    type = ConstantField("function", required=False)
    function = ToolCallFunctionOutput()


class ChatCompletionMessageOutput(serializers.Serializer[Any]):
    role = ConstantField("assistant")
    content = serializers.CharField(allow_blank=True, allow_null=True)
    reasoning_content = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="the model's reasoning, only when it reasoned (as vLLM and DeepSeek)",
    )
    tool_calls = ToolCallOutput(many=True, required=False)


class ChatCompletionChoiceOutput(serializers.Serializer[Any]):
    index = serializers.IntegerField(min_value=0)
    message = ChatCompletionMessageOutput()
    logprobs = ChoiceLogprobsOutput(allow_null=True, help_text="with logprobs: true")
    finish_reason = serializers.ChoiceField(choices=FINISH_REASONS)


class PromptTokensDetailsOutput(serializers.Serializer[Any]):
    cached_tokens = serializers.IntegerField(min_value=0)


class CompletionTokensDetailsOutput(serializers.Serializer[Any]):
    reasoning_tokens = serializers.IntegerField(min_value=0)


class ChatCompletionUsageOutput(serializers.Serializer[Any]):
    """``prompt_tokens`` includes the cached tokens, ``completion_tokens`` the reasoning."""

    prompt_tokens = serializers.IntegerField(min_value=0)
    completion_tokens = serializers.IntegerField(min_value=0)
    total_tokens = serializers.IntegerField(min_value=0)
    prompt_tokens_details = PromptTokensDetailsOutput()
    completion_tokens_details = CompletionTokensDetailsOutput()
    cache_hit = serializers.BooleanField(
        help_text="extension: answered by the response cache (no generation token charged)"
    )


class ChatCompletionOutput(serializers.Serializer[Any]):
    """OpenAI's ``chat.completion``, with the extension field ``citations``."""

    id = serializers.CharField(help_text="chatcmpl-<message id>")
    object = ConstantField("chat.completion")
    created = serializers.IntegerField(help_text="Unix time, seconds")
    model = serializers.CharField(help_text="the alias that served")
    choices = ChatCompletionChoiceOutput(many=True)
    usage = ChatCompletionUsageOutput(allow_null=True)
    citations = CitationOutput(many=True, help_text="extension: the passages the prompt kept")


class ChatCompletionDeltaOutput(serializers.Serializer[Any]):
    role = ConstantField("assistant", required=False)
    content = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    reasoning_content = serializers.CharField(required=False, allow_blank=True)
    tool_calls = ToolCallOutput(many=True, required=False)


class ChatCompletionChunkChoiceOutput(serializers.Serializer[Any]):
    index = serializers.IntegerField(min_value=0)
    delta = ChatCompletionDeltaOutput()
    logprobs = ChoiceLogprobsOutput(allow_null=True, help_text="with logprobs: true")
    finish_reason = serializers.ChoiceField(choices=FINISH_REASONS, allow_null=True)


class ChatCompletionChunkOutput(serializers.Serializer[Any]):
    """One ``chat.completion.chunk``: the role first, then text (or reasoning, or tool
    call) deltas, a last choice with ``finish_reason`` and the extension ``citations``;
    with ``stream_options.include_usage``, a chunk with no choice and the ``usage``."""

    id = serializers.CharField()
    object = ConstantField("chat.completion.chunk")
    created = serializers.IntegerField()
    model = serializers.CharField()
    choices = ChatCompletionChunkChoiceOutput(many=True)
    usage = ChatCompletionUsageOutput(required=False)
    citations = CitationOutput(many=True, required=False)


class ModelOutput(serializers.Serializer[Any]):
    id = serializers.CharField(help_text="a chat alias, or the embedding model's name")
    object = ConstantField("model")
    created = serializers.IntegerField()
    owned_by = serializers.CharField()


class ModelListOutput(serializers.Serializer[Any]):
    object = ConstantField("list")
    data = ModelOutput(many=True)  # type: ignore[assignment]
