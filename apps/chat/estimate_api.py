"""``POST /api/v1/estimate``: what an answer would cost, before asking for it.

The body is a native message request with its ``conversation`` id, or a
``/v1/chat/completions`` body (told apart by ``messages``); it is checked as that surface
checks it, then prepared as the answer would be, holding nothing
(:mod:`apps.chat.services.estimate`)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.permissions import get_caller
from apps.chat import services
from apps.chat.apis import ConversationMessageCreateApi
from apps.chat.openai_apis import ChatCompletionsApi
from apps.core.aio import AsyncApiView, db_call
from apps.core.exceptions import error_body
from apps.core.schema import ErrorDetailSerializer
from apps.core.validation import MAX_ID, validated
from apps.usage.tags import caller_tagged


class NativeEstimateInput(ConversationMessageCreateApi.InputSerializer):
    conversation = serializers.IntegerField(
        min_value=1, max_value=MAX_ID, help_text="the conversation the message would go to"
    )


class CostRangeOutput(serializers.Serializer[Any]):
    min = serializers.CharField(help_text="USD: the prompt alone")
    max = serializers.CharField(help_text="USD: the prompt and max_completion_tokens")


class EstimateOutput(serializers.Serializer[Any]):
    model = serializers.CharField(help_text="the alias that would serve (after routing)")
    prompt_tokens = serializers.IntegerField(help_text="after retrieval and assembly")
    max_completion_tokens = serializers.IntegerField()
    context_window = serializers.IntegerField()
    dropped_passages = serializers.IntegerField()
    dropped_turns = serializers.IntegerField()
    summarized_turns = serializers.IntegerField()
    dropped_tokens = serializers.IntegerField()
    cost_usd = CostRangeOutput()
    admitted = serializers.BooleanField(help_text="every limit would admit it now")
    error = ErrorDetailSerializer(allow_null=True, help_text="the refusal, when not admitted")


class EstimateApi(AsyncApiView):
    required_scopes = {"POST": "chat"}

    @extend_schema(
        request=NativeEstimateInput,
        responses={
            200: EstimateOutput,
            400: OpenApiResponse(description="as the surface the body is for would answer"),
            403: OpenApiResponse(description="model_not_allowed"),
            404: OpenApiResponse(description="no such conversation, or model"),
        },
    )
    async def post(self, request: Request) -> Response:
        """The prompt tokens a request would send after retrieval and assembly, the most it
        may generate, its cost range at the routed alias's prices, and whether every limit
        would admit it now. The body: a native message request with ``conversation``, or a
        ``/v1/chat/completions`` body (it has ``messages``). Its search runs, and its query
        embedding is charged, as any search's."""
        asked = await _request_of(request)
        estimate = await db_call(services.answer_estimate)(request=asked)
        prepared, refusal = estimate.prepared, estimate.refusal
        return Response(
            {
                "model": prepared.spec.alias,
                "prompt_tokens": prepared.prompt.prompt_tokens,
                "max_completion_tokens": prepared.max_tokens,
                "context_window": prepared.spec.context_window,
                "dropped_passages": prepared.dropped_passages,
                "dropped_turns": prepared.dropped_turns,
                "summarized_turns": prepared.summarized_turns,
                "dropped_tokens": prepared.dropped_tokens,
                "cost_usd": {"min": str(estimate.cost_min), "max": str(estimate.cost_max)},
                "admitted": refusal is None,
                "error": None
                if refusal is None
                else error_body(
                    type=refusal.type,
                    code=refusal.code,
                    message=refusal.message,
                    param=refusal.param,
                )["error"],
            }
        )


async def _request_of(request: Request) -> services.AnswerRequest:
    caller = get_caller(request)
    if isinstance(request.data, dict) and "messages" in request.data:
        data = validated(ChatCompletionsApi.InputSerializer, request)
        tag = (data.get("metadata") or {}).get("tag")
        caller = await caller_tagged(caller, tag, param="metadata.tag")
        model = await services.model_choose(alias=data["model"])
        return ChatCompletionsApi.InputSerializer.to_request(data, caller=caller, model=model)
    data = validated(NativeEstimateInput, request)
    caller = await caller_tagged(caller, data.get("tag"))
    model = await services.model_choose(alias=data.get("model"))
    return NativeEstimateInput.to_request(
        data, caller=caller, model=model, conversation=data["conversation"]
    )
