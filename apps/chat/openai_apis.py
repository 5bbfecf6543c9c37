"""The OpenAI-compatible surface: ``POST /v1/chat/completions`` and ``GET /v1/models``.

The official ``openai`` SDK, LangChain's ``ChatOpenAI`` and LlamaIndex's ``OpenAILike``
work unmodified with ``base_url=<host>/v1``. RAG applies to the last user message (turn it
off or narrow it with the extension field ``rag``); citations ride in an extension field
``citations``. The answer is the same stream the native API sends, re-framed.

Tools pass through: ``tools``, ``tool_choice``, ``parallel_tool_calls``, assistant
``tool_calls`` and ``tool`` messages. In a tool loop the turns after the last user message
(the calls and their results) follow it in the prompt, after its passages, so the model
reads a tool's result last; retrieval searches with that user message. Stored exchanges
(``store``) keep the text; the calls live in the message's events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from django.conf import settings
from django.http import HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.permissions import get_caller
from apps.accounts.selectors import Caller
from apps.chat import selectors, services
from apps.chat.sampling_input import SamplingInput, sampling_values
from apps.chat.serializers import (
    ChatCompletionChunkOutput,
    ChatCompletionOutput,
    ModelListOutput,
)
from apps.chat.services import CollectedAnswer
from apps.chat.sse import EventStreamRenderer, event_stream_response, with_pings
from apps.chat.wire import OpenAIWire, answer_respond, openai_completion, stored_events
from apps.core.aio import AsyncApiView, db_call
from apps.core.exceptions import InvalidRequest
from apps.core.idempotency import (
    REPLAYED_HEADER,
    idempotency_key_of,
    idempotency_release,
    idempotency_request_aclaim,
)
from apps.core.models import IdempotencyKey
from apps.core.schema import (
    ANSWER_RESPONSES,
    IDEMPOTENCY_RESPONSES,
    ErrorSerializer,
    event_stream,
    idempotency_key_parameter,
)
from apps.core.validation import MAX_ID, chat_messages_check, message_length_check, validated
from apps.knowledge.apis import SearchFiltersInput, search_mode_field
from apps.knowledge.services import DEFAULT_SEARCH_MODE, embedding_model_name
from inference import ChatMessage, Tools

TEXT_PART_SEPARATOR = "\n"
"""How a message's text parts are joined: as vLLM joins them
(``vllm/entrypoints/chat_utils.py``, ``"\n".join(texts)``), so that a prompt counted here
is the prompt a vLLM upstream would build from the same parts."""

TEXT_PART_SCHEMA = {
    "type": "object",
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    "required": ["type", "text"],
}


MAX_TOOLS = 128
"""OpenAI's own cap on ``tools``."""
MAX_TOOLS_CHARS = 256 * 1024
"""The most characters ``tools`` may take as JSON: each definition is counted into every
prompt, so a cap well under the body's keeps the count bounded before it runs."""
TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
"""A function's name, as OpenAI constrains it."""


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


class FunctionCallInput(serializers.Serializer[dict[str, Any]]):
    name = serializers.RegexField(TOOL_NAME)
    arguments = serializers.CharField(allow_blank=True, trim_whitespace=False)


class ToolCallInput(serializers.Serializer[dict[str, Any]]):
    """A call an earlier assistant turn made, sent back in a tool loop."""

    id = serializers.CharField(max_length=256)
    type = serializers.ChoiceField(choices=["function"])
    function = FunctionCallInput()


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


class FunctionInput(serializers.Serializer[dict[str, Any]]):
    name = serializers.RegexField(TOOL_NAME)
    description = serializers.CharField(required=False, allow_blank=True)
    parameters = serializers.DictField(required=False, help_text="a JSON Schema object")
    strict = serializers.BooleanField(required=False, allow_null=True)


class ToolInput(serializers.Serializer[dict[str, Any]]):
    type = serializers.ChoiceField(choices=["function"])
    function = FunctionInput()


class ToolListInput(serializers.ListSerializer[dict[str, Any]]):
    """``tools``: at most :data:`MAX_TOOLS`, :data:`MAX_TOOLS_CHARS` as JSON, checked
    before any is validated; names unique."""

    def to_internal_value(self, data: Any) -> list[dict[str, Any]]:
        if isinstance(data, list):
            size = len(json.dumps(data))
            if len(data) > MAX_TOOLS or size > MAX_TOOLS_CHARS:
                raise InvalidRequest(
                    f"tools: {len(data)} definitions, {size} characters of JSON; at most "
                    f"{MAX_TOOLS} and {MAX_TOOLS_CHARS} are accepted.",
                    code="too_many_tools",
                    param="tools",
                )
        tools: list[dict[str, Any]] = super().to_internal_value(data)
        names = [tool["function"]["name"] for tool in tools]
        if len(set(names)) != len(names):
            raise InvalidRequest("tools: function names must be unique.", param="tools")
        return tools


class ToolListItemInput(ToolInput):
    class Meta:
        list_serializer_class = ToolListInput


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "enum": ["none", "auto", "required"]},
            {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["function"]},
                    "function": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
                "required": ["type", "function"],
            },
        ]
    }
)
class ToolChoiceField(serializers.Field[Any, Any, Any, Any]):
    """``tool_choice``: ``none``, ``auto``, ``required``, or one function named."""

    def to_internal_value(self, data: Any) -> str | dict[str, Any]:
        if data in ("none", "auto", "required"):
            return str(data)
        if isinstance(data, dict) and data.get("type") == "function":
            name = (data.get("function") or {}).get("name")
            if isinstance(name, str) and name:
                return {"type": "function", "function": {"name": name}}
        raise serializers.ValidationError(
            'none, auto, required or {"type": "function", "function": {"name": …}}.'
        )

    def to_representation(self, value: Any) -> Any:
        return value


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


class ChatCompletionsApi(AsyncApiView):
    required_scopes = {"POST": "chat"}
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    class InputSerializer(SamplingInput):
        model = serializers.CharField(max_length=64)
        messages = MessageInput(many=True, allow_empty=False)
        stream = serializers.BooleanField(default=False)
        stream_options = StreamOptionsInput(required=False)
        max_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1)
        max_completion_tokens = serializers.IntegerField(
            required=False,
            allow_null=True,
            min_value=1,
            help_text="the same as max_tokens (OpenAI's newer name); both given must agree",
        )
        tools = ToolListItemInput(many=True, required=False, allow_empty=False)
        tool_choice = ToolChoiceField(required=False)
        parallel_tool_calls = serializers.BooleanField(required=False)
        rag = RagInput(required=False)
        store = serializers.BooleanField(
            required=False,
            help_text="keep the exchange as a conversation (default: OPENAI_STORE_DEFAULT, "
            "off); the usage row is written either way",
        )
        cache = serializers.BooleanField(
            required=False,
            default=True,
            help_text="extension: false skips the response cache (single-turn requests "
            "are answered from it when unchanged; usage then says cache_hit: true)",
        )

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            """The answer is to the last message: the user's, or in a tool loop a tool's
            result after a user message. ``max_tokens`` and ``max_completion_tokens`` are
            one limit: given both, they must agree. ``tool_choice`` needs ``tools``, and a
            function it names is one of them."""
            messages = attrs["messages"]
            if messages[-1]["role"] not in ("user", "tool") or not any(
                m["role"] == "user" for m in messages
            ):
                raise InvalidRequest(
                    "The last message must be the user's, or a tool's result after a user message.",
                    param="messages",
                )
            _tools_check(attrs)
            limits = {attrs.get("max_tokens"), attrs.get("max_completion_tokens")} - {None}
            if len(limits) > 1:
                raise InvalidRequest(
                    "max_completion_tokens: differs from max_tokens; send one of them.",
                    param="max_completion_tokens",
                )
            return attrs

        @staticmethod
        def to_request(
            data: dict[str, Any], *, caller: Caller, model: services.ModelChoice
        ) -> services.AnswerRequest:
            """The answer ``data`` (validated) asks for: RAG on the last user message, the
            earlier user and assistant turns as history, the system and developer
            messages as instructions."""
            messages: list[dict[str, Any]] = data["messages"]
            rag = data.get("rag") or {"enabled": True, "top_k": 5, "mode": DEFAULT_SEARCH_MODE}
            collections = rag.get("collections")
            asked = max(i for i, m in enumerate(messages) if m["role"] == "user")
            return services.AnswerRequest(
                caller=caller,
                model=model,
                content=messages[asked]["content"],
                conversation=None,  # a new one, written with the messages if stored
                history=tuple(_chat(m) for m in messages[:asked] if m["role"] in TURNS),
                tail=tuple(_chat(m) for m in messages[asked + 1 :] if m["role"] in TURNS),
                tools=_tools(data),
                instructions="\n\n".join(
                    m["content"] for m in messages if m["role"] in ("system", "developer")
                ),
                rag=rag["enabled"] and rag["top_k"] > 0,
                collection_ids=None if collections is None else tuple(collections),
                top_k=rag["top_k"],
                search_mode=rag["mode"],
                search_filters=rag.get("filters"),
                max_tokens=data.get("max_completion_tokens") or data.get("max_tokens"),
                want_reasoning=True,  # as vLLM and DeepSeek: whenever the model reasons
                store=data.get("store", settings.OPENAI_STORE_DEFAULT),
                cache=data["cache"],
                **sampling_values(data),
            )

    @extend_schema(
        request=InputSerializer,
        parameters=[idempotency_key_parameter()],
        responses={
            **IDEMPOTENCY_RESPONSES,
            (200, "application/json"): OpenApiResponse(
                response=ChatCompletionOutput, description="chat.completion"
            ),
            (200, "text/event-stream"): event_stream(
                "with stream: chat.completion.chunk events (an error after the first: "
                "{error}), then [DONE]",
                data=[ChatCompletionChunkOutput, ErrorSerializer],
                sentinel="[DONE]",
            ),
            400: OpenApiResponse(
                description="context_length_exceeded, max_tokens_too_large, too_many_messages, "
                "too_many_content_parts, too_many_tools, unsupported_parameter (a content part "
                "that is not text; tools, tool_choice or parallel_tool_calls the model's "
                "server cannot honour), invalid_value (store: false with an Idempotency-Key)"
            ),
            404: OpenApiResponse(description="model_not_found: no such model alias"),
            **ANSWER_RESPONSES,
        },
    )
    async def post(self, request: Request) -> HttpResponseBase:
        """OpenAI's Chat Completions, answered over the caller's collections.

        With an ``Idempotency-Key``, the same key and body from the same team replays the
        first completion (its stored message, or its events re-framed as chunks) with
        ``Idempotent-Replayed: true``; the exchange is then stored (``store: true``), since
        a replay needs it."""
        data = validated(self.InputSerializer, request)
        caller = get_caller(request)
        include_usage = (data.get("stream_options") or {}).get("include_usage", False)
        wire = OpenAIWire(include_usage=include_usage)
        claim = await _claim(request, caller=caller, data=data)
        if claim is not None and claim.status == IdempotencyKey.Status.COMPLETE:
            return await completion_replay(
                caller=caller, claim=claim, wire=wire, stream=data["stream"]
            )
        try:
            model = await services.model_choose(alias=data["model"])
            asked = self.InputSerializer.to_request(data, caller=caller, model=model)
            if claim is not None:
                asked = dataclasses.replace(asked, store=True)
            prepared = await db_call(services.answer_prepare)(request=asked)
            return await answer_respond(prepared, wire=wire, stream=data["stream"], claim=claim)
        except BaseException:
            if claim is not None:  # nothing to replay: a retry runs afresh
                await asyncio.shield(db_call(idempotency_release)(claim=claim))
            raise


async def _claim(
    request: Request, *, caller: Caller, data: dict[str, Any]
) -> IdempotencyKey | None:
    """The request's ``Idempotency-Key`` claimed (as on the native API), or None without
    one. A replay needs the first answer kept, so ``store: false`` with a key is a 400."""
    if data.get("store") is False and idempotency_key_of(request.headers) is not None:
        raise InvalidRequest(
            "An Idempotency-Key replays the first answer, which must then be stored: "
            "send store: true (or leave it out), or no key.",
            code="invalid_value",
            param="store",
        )
    return await idempotency_request_aclaim(request=request, team=caller.team, body=data)


async def completion_replay(
    *, caller: Caller, claim: IdempotencyKey, wire: OpenAIWire, stream: bool
) -> HttpResponseBase:
    """What a retry with the same ``Idempotency-Key`` gets: the first answer's stored
    events re-framed as ``chat.completion.chunk`` frames (a stream), or its stored message
    as a ``chat.completion`` (JSON); nothing generated or charged."""
    assert claim.resource_id is not None  # noqa: S101 - a completed claim names its message
    message = await db_call(selectors.message_get)(team=caller.team, message_id=claim.resource_id)
    response: HttpResponseBase
    if stream:
        stored = await services.replay_open(team=caller.team, message_id=message.pk, after=0)
        response = event_stream_response(with_pings(wire.frames(stored_events(stored))))
    else:
        answer = CollectedAnswer(
            message_id=message.pk,
            content=message.content,
            reasoning=message.reasoning,
            citations=message.citations,
            usage=selectors.message_usage(message=message),
            finish_reason=message.finish_reason,
            model=message.model,
        )
        response = Response(openai_completion(answer), status=claim.response_status or 200)
    response[REPLAYED_HEADER] = "true"
    return response


class ModelListApi(APIView):
    required_scopes = {"GET": "chat"}

    @extend_schema(responses={200: ModelListOutput})
    def get(self, request: Request) -> Response:
        """The model aliases this deployment serves, and its embedding model (for
        ``/v1/embeddings``) under the model's own name."""
        names = [*services.model_aliases(), embedding_model_name()]
        return Response(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "ragtier"}
                    for name in names
                ],
            }
        )


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


def _chat(message: dict[str, Any]) -> ChatMessage:
    chat: ChatMessage = {"role": message["role"], "content": message["content"]}
    if message.get("tool_calls"):
        chat["tool_calls"] = [
            {"id": c["id"], "type": c["type"], "function": dict(c["function"])}
            for c in message["tool_calls"]
        ]
    if message["role"] == "tool":
        chat["tool_call_id"] = message["tool_call_id"]
    return chat


def _tools_check(attrs: dict[str, Any]) -> None:
    """``tool_choice`` and ``parallel_tool_calls`` mean nothing without ``tools`` (400, as
    OpenAI answers); a function ``tool_choice`` names is one of them."""
    tools, choice = attrs.get("tools"), attrs.get("tool_choice")
    if not tools:
        for name in ("tool_choice", "parallel_tool_calls"):
            if attrs.get(name) is not None:
                raise InvalidRequest(f"{name} is only allowed when tools are given.", param=name)
        return
    if isinstance(choice, dict):
        named = choice["function"]["name"]
        if named not in {tool["function"]["name"] for tool in tools}:
            raise InvalidRequest(
                f"tool_choice names {named[:64]!r}, which is not among tools.",
                param="tool_choice",
            )


def _tools(data: dict[str, Any]) -> Tools | None:
    tools = data.get("tools")
    if not tools:
        return None
    definitions = tuple(
        {
            "type": "function",
            "function": {k: v for k, v in tool["function"].items() if v is not None},
        }
        for tool in tools
    )
    return Tools(
        definitions=definitions,
        choice=data.get("tool_choice"),
        parallel=data.get("parallel_tool_calls"),
    )
