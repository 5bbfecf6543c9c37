"""What ``POST /v1/chat/completions`` accepts, field by field: messages and their content
parts, the ``rag`` and ``stream_options`` objects, and the checks that bound them before
anything is counted; tools are in :mod:`apps.chat.openai_tools`.

``openai_apis.ChatCompletionsApi.InputSerializer`` puts these together and turns the result
into one :class:`~apps.chat.services.AnswerRequest`, each message read by
:func:`chat_message`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.chat.openai_tools import MAX_TOOLS, ToolCallInput
from apps.core.exceptions import InvalidRequest
from apps.core.validation import MAX_ID, chat_messages_check, message_length_check
from apps.knowledge.apis import SearchFiltersInput, search_mode_field
from inference import ChatMessage

TEXT_PART_SEPARATOR = "\n"
"""How a message's text parts are joined: as vLLM joins them
(``vllm/entrypoints/chat_utils.py``, ``"\n".join(texts)``), so that a prompt counted here
is the prompt a vLLM upstream would build from the same parts."""

TEXT_PART_SCHEMA = {
    "type": "object",
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    "required": ["type", "text"],
}


class MessageListInput(serializers.ListSerializer[dict[str, Any]]):
    """``messages``: how many (``RAGTIER_MAX_CHAT_MESSAGES``) and how long each
    (``RAGTIER_MAX_MESSAGE_CHARS``; for content parts, their joined text), and which
    content parts, checked before any one is validated or counted."""

    def to_internal_value(self, data: Any) -> list[dict[str, Any]]:
        param = self.field_name or "messages"
        chat_messages_check(data, param=param)
        content_parts_check(data, param=param)
        messages: list[dict[str, Any]] = super().to_internal_value(data)
        return messages


@extend_schema_field(
    {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": TEXT_PART_SCHEMA}]}
)
class MessageContentField(serializers.Field[str, str | list[Any], str, Any]):
    """A message's ``content``: a string, or a list of ``{"type": "text", "text": …}``
    parts, joined into one string (:data:`TEXT_PART_SEPARATOR`) as the prompt reads it."""

    def to_internal_value(self, data: Any) -> str:
        if isinstance(data, str):
            return data
        if isinstance(data, list) and data and all(_is_text_part(part) for part in data):
            return TEXT_PART_SEPARATOR.join(part["text"] for part in data)
        raise serializers.ValidationError("a string or a non-empty list of text parts.")

    def to_representation(self, value: str) -> str:
        return value


class MessageInput(serializers.Serializer[dict[str, Any]]):
    role = serializers.ChoiceField(choices=["system", "developer", "user", "assistant", "tool"])
    content = MessageContentField(required=False, allow_null=True)
    tool_calls = serializers.ListField(child=ToolCallInput(), required=False, max_length=MAX_TOOLS)
    tool_call_id = serializers.CharField(
        required=False, max_length=256, help_text="a tool message: the call it answers"
    )

    class Meta:
        list_serializer_class = MessageListInput

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Content may be null (or left out) only on an assistant turn that calls tools;
        a ``tool`` turn names the call it answers; only an assistant turn calls."""
        role = attrs["role"]
        if attrs.get("tool_calls") and role != "assistant":
            raise serializers.ValidationError({"tool_calls": "only an assistant turn calls."})
        if role == "tool" and not attrs.get("tool_call_id"):
            raise serializers.ValidationError({"tool_call_id": "a tool message needs one."})
        if attrs.get("content") is None:
            if not (role == "assistant" and attrs.get("tool_calls")):
                raise serializers.ValidationError({"content": "this field is required."})
            attrs["content"] = ""
        return attrs


class RagInput(serializers.Serializer[dict[str, Any]]):
    enabled = serializers.BooleanField(default=True)
    collections = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
        required=False,
        max_length=100,
    )
    top_k = serializers.IntegerField(min_value=0, max_value=settings.MAX_TOP_K, default=5)
    mode = search_mode_field()
    filters = SearchFiltersInput(required=False)


class StreamOptionsInput(serializers.Serializer[dict[str, Any]]):
    include_usage = serializers.BooleanField(default=False)


def content_parts_check(messages: object, *, param: str = "messages") -> None:
    """Each message's content parts, before any message is validated or counted: at most
    ``RAGTIER_MAX_CHAT_MESSAGES`` of them, each a text part (any other type, such as
    ``image_url``, ``input_audio`` or ``file``, is 400 ``unsupported_parameter`` naming the
    type and the part), their joined text no longer than ``RAGTIER_MAX_MESSAGE_CHARS``."""
    if not isinstance(messages, list):
        return  # the serializer says what is wrong with it
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            _parts_check(content, param=f"{param}.{index}.content")


def _parts_check(parts: list[Any], *, param: str) -> None:
    limit = settings.MAX_CHAT_MESSAGES
    if not parts or len(parts) > limit:
        raise InvalidRequest(
            f"{param} has {len(parts)} content parts; 1 to {limit} are accepted.",
            code="invalid_value" if not parts else "too_many_content_parts",
            param=param,
        )
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise InvalidRequest(
                f"{param}.{index}: a content part is an object with a type.",
                code="invalid_value",
                param=f"{param}.{index}",
            )
        if kind != "text":
            raise InvalidRequest(
                f"Content parts of type {kind[:64]!r} are not accepted by this model; "
                "send text parts.",
                code="unsupported_parameter",
                param=f"{param}.{index}.type",
            )
        if not _is_text_part(part):
            raise InvalidRequest(
                f"{param}.{index}.text: a text part's text is a string.",
                code="invalid_value",
                param=f"{param}.{index}.text",
            )
    message_length_check(TEXT_PART_SEPARATOR.join(part["text"] for part in parts), param=param)


def _is_text_part(part: object) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


TURNS = ("user", "assistant", "tool")
"""The roles that are turns of the conversation (system and developer messages are
instructions)."""


def chat_message(message: dict[str, Any]) -> ChatMessage:
    """A validated message as the prompt reads it: its calls and the call it answers kept."""
    chat: ChatMessage = {"role": message["role"], "content": message["content"]}
    if message.get("tool_calls"):
        chat["tool_calls"] = [
            {"id": c["id"], "type": c["type"], "function": dict(c["function"])}
            for c in message["tool_calls"]
        ]
    if message["role"] == "tool":
        chat["tool_call_id"] = message["tool_call_id"]
    return chat


NOT_SERVED: dict[str, str] = {
    "audio": "audio output is not generated",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not offered",
    "functions": "the deprecated functions field is not supported: send tools",
    "function_call": "the deprecated function_call field is not supported: send tool_choice",
    "reasoning_effort": "the reasoning effort cannot be set on these models",
    "verbosity": "the verbosity cannot be set on these models",
}
"""Fields of OpenAI's Chat Completions that change the output and that no tier here can
honour: set (not null), each is a 400 ``unsupported_parameter`` naming it, never dropped.
``modalities`` other than text and a ``service_tier`` other than ``auto`` or ``default``
are refused the same way; fields that change no output (``prompt_cache_key``,
``safety_identifier``, ``store``) are accepted."""
DEFAULT_TIERS = frozenset({"auto", "default"})


def openai_fields_refuse(raw: object) -> None:
    """400 ``unsupported_parameter`` for the first field of the raw body that asks for
    what no tier here serves (:data:`NOT_SERVED`)."""
    if not isinstance(raw, dict):
        return
    for name, why in NOT_SERVED.items():
        if raw.get(name) is not None:
            raise InvalidRequest(f"{name}: {why}.", code="unsupported_parameter", param=name)
    modalities = raw.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise InvalidRequest(
            "modalities: only text is generated.", code="unsupported_parameter", param="modalities"
        )
    tier = raw.get("service_tier")
    if tier is not None and tier not in DEFAULT_TIERS:
        raise InvalidRequest(
            "service_tier: this deployment has one tier (auto, default).",
            code="unsupported_parameter",
            param="service_tier",
        )
