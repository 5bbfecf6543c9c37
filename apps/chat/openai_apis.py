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
from typing import Any

from django.conf import settings
from django.http import HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.permissions import get_caller
from apps.accounts.selectors import Caller
from apps.chat import services
from apps.chat.openai_inputs import (
    TURNS,
    MessageInput,
    RagInput,
    StreamOptionsInput,
    chat_message,
    openai_fields_refuse,
)
from apps.chat.openai_replay import completion_claim, completion_replay
from apps.chat.openai_tools import ToolChoiceField, ToolListItemInput, tools_check, tools_of
from apps.chat.sampling_input import SamplingInput, sampling_values
from apps.chat.serializers import (
    ChatCompletionChunkOutput,
    ChatCompletionOutput,
    ModelListOutput,
)
from apps.chat.sse import EventStreamRenderer
from apps.chat.wire import OpenAIWire, answer_respond
from apps.core.aio import AsyncApiView, db_call
from apps.core.exceptions import InvalidRequest
from apps.core.idempotency import idempotency_release
from apps.core.models import IdempotencyKey
from apps.core.schema import (
    ANSWER_RESPONSES,
    IDEMPOTENCY_RESPONSES,
    ErrorSerializer,
    event_stream,
    idempotency_key_parameter,
)
from apps.core.validation import validated
from apps.knowledge.services import DEFAULT_SEARCH_MODE, embedding_model_name
from apps.usage.tags import caller_tagged


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
            attrs = super().validate(attrs)
            openai_fields_refuse(self.initial_data)
            messages = attrs["messages"]
            if messages[-1]["role"] not in ("user", "tool") or not any(
                m["role"] == "user" for m in messages
            ):
                raise InvalidRequest(
                    "The last message must be the user's, or a tool's result after a user message.",
                    param="messages",
                )
            tools_check(attrs)
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
                history=tuple(chat_message(m) for m in messages[:asked] if m["role"] in TURNS),
                tail=tuple(chat_message(m) for m in messages[asked + 1 :] if m["role"] in TURNS),
                tools=tools_of(data),
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
        tag = (data.get("metadata") or {}).get("tag")
        caller = await caller_tagged(get_caller(request), tag, param="metadata.tag")
        include_usage = (data.get("stream_options") or {}).get("include_usage", False)
        wire = OpenAIWire(include_usage=include_usage)
        claim = await completion_claim(request, caller=caller, data=data)
        if claim is not None and claim.status == IdempotencyKey.Status.COMPLETE:
            return await completion_replay(
                caller=caller, claim=claim, wire=wire, stream=data["stream"]
            )
        try:
            model = await services.model_choose(alias=data["model"])
            asked = self.InputSerializer.to_request(data, caller=caller, model=model)
            if claim is not None:
                asked = dataclasses.replace(asked, store=True)
            prepared = await services.answer_ready(asked)
            return await answer_respond(prepared, wire=wire, stream=data["stream"], claim=claim)
        except BaseException:
            if claim is not None:  # nothing to replay: a retry runs afresh
                await asyncio.shield(db_call(idempotency_release)(claim=claim))
            raise


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
