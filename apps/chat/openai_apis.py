"""The OpenAI-compatible surface: ``POST /v1/chat/completions`` and ``GET /v1/models``.

The official ``openai`` SDK, LangChain's ``ChatOpenAI`` and LlamaIndex's ``OpenAILike``
work unmodified with ``base_url=<host>/v1``. RAG applies to the last user message (turn it
off or narrow it with the extension field ``rag``); citations ride in an extension field
``citations``. The answer is the same stream the native API sends, re-framed.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.permissions import get_caller
from apps.accounts.selectors import Caller
from apps.chat import services
from apps.chat.sse import EventStreamRenderer
from apps.chat.wire import OpenAIWire, answer_respond
from apps.core.aio import AsyncApiView, db_call
from apps.core.exceptions import InvalidRequest
from apps.core.schema import ANSWER_RESPONSES, event_stream
from apps.core.validation import MAX_ID, chat_messages_check, validated
from apps.knowledge.apis import SearchFiltersInput, search_mode_field
from apps.knowledge.services import DEFAULT_SEARCH_MODE
from inference import ChatMessage


class MessageListInput(serializers.ListSerializer[dict[str, Any]]):
    """``messages``: how many (``RAGTIER_MAX_CHAT_MESSAGES``) and how long each
    (``RAGTIER_MAX_MESSAGE_CHARS``), checked before any one is validated or counted."""

    def to_internal_value(self, data: Any) -> list[dict[str, Any]]:
        chat_messages_check(data, param=self.field_name or "messages")
        messages: list[dict[str, Any]] = super().to_internal_value(data)
        return messages


class MessageInput(serializers.Serializer[dict[str, Any]]):
    role = serializers.ChoiceField(choices=["system", "developer", "user", "assistant"])
    content = serializers.CharField(allow_blank=True, trim_whitespace=False)

    class Meta:
        list_serializer_class = MessageListInput


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

    class InputSerializer(serializers.Serializer[dict[str, Any]]):
        model = serializers.CharField(max_length=64)
        messages = MessageInput(many=True, allow_empty=False)
        stream = serializers.BooleanField(default=False)
        stream_options = StreamOptionsInput(required=False)
        max_tokens = serializers.IntegerField(required=False, min_value=1)
        max_completion_tokens = serializers.IntegerField(required=False, min_value=1)
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
            """The answer is to the last message: it must be the user's."""
            if attrs["messages"][-1]["role"] != "user":
                raise InvalidRequest("The last message must be the user's.", param="messages")
            return attrs

        @staticmethod
        def to_request(
            data: dict[str, Any], *, caller: Caller, model: services.ModelChoice
        ) -> services.AnswerRequest:
            """The answer ``data`` (validated) asks for: RAG on the last user message, the
            earlier user and assistant turns as history, the system and developer
            messages as instructions."""
            messages: list[dict[str, str]] = data["messages"]
            rag = data.get("rag") or {"enabled": True, "top_k": 5, "mode": DEFAULT_SEARCH_MODE}
            collections = rag.get("collections")
            return services.AnswerRequest(
                caller=caller,
                model=model,
                content=messages[-1]["content"],
                conversation=None,  # a new one, written with the messages if stored
                history=tuple(
                    _chat(m) for m in messages[:-1] if m["role"] in ("user", "assistant")
                ),
                instructions="\n\n".join(
                    m["content"] for m in messages if m["role"] in ("system", "developer")
                ),
                rag=rag["enabled"] and rag["top_k"] > 0,
                collection_ids=None if collections is None else tuple(collections),
                top_k=rag["top_k"],
                search_mode=rag["mode"],
                search_filters=rag.get("filters"),
                max_tokens=data.get("max_completion_tokens") or data.get("max_tokens"),
                store=data.get("store", settings.OPENAI_STORE_DEFAULT),
                cache=data["cache"],
            )

    @extend_schema(
        request=InputSerializer,
        responses={
            (200, "application/json"): OpenApiResponse(
                response=OpenApiTypes.OBJECT, description="chat.completion"
            ),
            (200, "text/event-stream"): event_stream(
                "with stream: chat.completion.chunk events, then [DONE]"
            ),
            400: OpenApiResponse(
                description="context_length_exceeded, max_tokens_too_large, too_many_messages"
            ),
            404: OpenApiResponse(description="model_not_found: no such model alias"),
            **ANSWER_RESPONSES,
        },
    )
    async def post(self, request: Request) -> HttpResponseBase:
        """OpenAI's Chat Completions, answered over the caller's collections."""
        data = validated(self.InputSerializer, request)
        caller = get_caller(request)
        model = await services.model_choose(alias=data["model"])
        asked = self.InputSerializer.to_request(data, caller=caller, model=model)
        prepared = await db_call(services.answer_prepare)(request=asked)
        include_usage = (data.get("stream_options") or {}).get("include_usage", False)
        wire = OpenAIWire(include_usage=include_usage)
        return await answer_respond(prepared, wire=wire, stream=data["stream"])


class ModelListApi(APIView):
    required_scopes = {"GET": "chat"}

    @extend_schema(
        responses={
            200: OpenApiResponse(response=OpenApiTypes.OBJECT, description="OpenAI model list")
        }
    )
    def get(self, request: Request) -> Response:
        """The model aliases this deployment serves."""
        return Response(
            {
                "object": "list",
                "data": [
                    {"id": alias, "object": "model", "created": 0, "owned_by": "ragtier"}
                    for alias in services.model_aliases()
                ],
            }
        )


def _chat(message: dict[str, str]) -> ChatMessage:
    return {"role": message["role"], "content": message["content"]}
