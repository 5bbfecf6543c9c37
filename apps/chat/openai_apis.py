"""The OpenAI-compatible surface: ``POST /v1/chat/completions`` and ``GET /v1/models``.

The official ``openai`` SDK, LangChain's ``ChatOpenAI`` and LlamaIndex's ``OpenAILike``
work unmodified with ``base_url=<host>/v1``. RAG applies to the last user message (turn it
off or narrow it with the extension field ``rag``); citations ride in an extension field
``citations``. The answer is the same stream the native API sends, re-framed.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from sse_starlette import ServerSentEvent

from apps.accounts.permissions import get_caller
from apps.chat import services
from apps.chat.apis import UPSTREAM_STATUS
from apps.chat.services import AnswerEvent, CollectedAnswer, PreparedAnswer
from apps.chat.sse import EventStreamRenderer, event_stream_response
from apps.core.exceptions import InvalidRequest, error_response
from apps.core.validation import validated
from inference import ChatMessage


class MessageInput(serializers.Serializer[dict[str, Any]]):
    role = serializers.ChoiceField(choices=["system", "developer", "user", "assistant"])
    content = serializers.CharField(allow_blank=True, trim_whitespace=False)


class RagInput(serializers.Serializer[dict[str, Any]]):
    enabled = serializers.BooleanField(default=True)
    collections = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, max_length=100
    )
    top_k = serializers.IntegerField(min_value=0, max_value=settings.MAX_TOP_K, default=5)


class StreamOptionsInput(serializers.Serializer[dict[str, Any]]):
    include_usage = serializers.BooleanField(default=False)


class ChatCompletionsApi(APIView):
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

    @extend_schema(
        request=InputSerializer,
        responses={
            200: OpenApiResponse(
                description="chat.completion, or a stream of chat.completion.chunk then [DONE]"
            )
        },
    )
    def post(self, request: Request) -> HttpResponseBase:
        """OpenAI's Chat Completions, answered over the caller's collections."""
        data = validated(self.InputSerializer, request)
        messages: list[dict[str, str]] = data["messages"]
        if messages[-1]["role"] != "user":
            raise InvalidRequest("The last message must be the user's.", param="messages")
        rag = data.get("rag") or {"enabled": True, "top_k": 5}
        caller = get_caller(request)
        conversation = services.conversation_create(caller=caller, title="openai")
        prepared = services.answer_prepare(
            caller=caller,
            conversation=conversation,
            content=messages[-1]["content"],
            collection_ids=rag.get("collections"),
            model=data["model"],
            max_tokens=data.get("max_completion_tokens") or data.get("max_tokens"),
            top_k=rag["top_k"],
            rag=rag["enabled"] and rag["top_k"] > 0,
            history=[_chat(m) for m in messages[:-1] if m["role"] in ("user", "assistant")],
            instructions="\n\n".join(
                m["content"] for m in messages if m["role"] in ("system", "developer")
            ),
        )
        if data["stream"]:
            include_usage = (data.get("stream_options") or {}).get("include_usage", False)
            return event_stream_response(_chunks(prepared, include_usage=include_usage))
        answer = async_to_sync(services.answer_collect)(prepared)
        if answer.error is not None and not answer.content:
            code = answer.error["code"]
            return error_response(UPSTREAM_STATUS.get(code, 502), **answer.error)
        return Response(_completion(prepared, answer))


class ModelListApi(APIView):
    required_scopes = {"GET": "chat"}

    @extend_schema(responses={200: OpenApiResponse(description="OpenAI model list")})
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


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "total_tokens": usage["total_tokens"],
        "prompt_tokens_details": {"cached_tokens": usage["cached_tokens"]},
        "completion_tokens_details": {"reasoning_tokens": usage["reasoning_tokens"]},
    }


def _finish(reason: str) -> str:
    return reason if reason in ("stop", "length", "content_filter", "tool_calls") else "stop"


def _completion(prepared: PreparedAnswer, answer: CollectedAnswer) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{answer.message_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": prepared.spec.alias,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": answer.content},
                "finish_reason": _finish(answer.finish_reason),
            }
        ],
        "usage": _usage(answer.usage),
        "citations": answer.citations,
    }


async def _chunks(prepared: PreparedAnswer, *, include_usage: bool) -> AsyncIterator[bytes]:
    base = {
        "id": f"chatcmpl-{prepared.message.pk}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": prepared.spec.alias,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        body = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return _data(body)

    yield chunk({"role": "assistant", "content": ""})
    citations: list[dict[str, Any]] = []
    usage: dict[str, Any] = {}
    event: AnswerEvent
    async for event in services.answer_events(prepared):
        match event.event:
            case "retrieval":
                citations = event.data["citations"]
            case "delta":
                yield chunk({"content": event.data["text"]})
            case "error":
                yield _data({"error": event.data})
            case "usage":
                usage = event.data
            case "done":
                yield chunk({}, finish=_finish(event.data["finish_reason"]), citations=citations)
    if include_usage and usage:
        yield _data({**base, "choices": [], "usage": _usage(usage)})
    yield ServerSentEvent(data="[DONE]").encode()


def _data(body: dict[str, Any]) -> bytes:
    return ServerSentEvent(data=json.dumps(body, ensure_ascii=False)).encode()
