"""HTTP for conversations, messages (SSE or JSON), replay, cancel and tokenize."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from django.conf import settings
from django.http import HttpResponseBase
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
)
from rest_framework import serializers, status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.permissions import get_caller, role_require_own_or_manager
from apps.accounts.selectors import Caller
from apps.chat import selectors, services
from apps.chat.models import Message
from apps.chat.sampling_input import SamplingInput, sampling_values
from apps.chat.serializers import (
    ANSWER_EVENTS,
    AnswerOutput,
    ConversationDetailOutput,
    ConversationOutput,
    MessageOutput,
)
from apps.chat.sse import (
    EventStreamRenderer,
    event_stream_response,
    frame_stored,
    last_event_id,
    with_pings,
)
from apps.chat.wire import NativeWire, answer_respond, stored_events
from apps.core.aio import AsyncApiView, db_call
from apps.core.idempotency import (
    REPLAYED_HEADER,
    idempotency_release,
    idempotency_request_aclaim,
)
from apps.core.models import IdempotencyKey
from apps.core.pagination import Pagination
from apps.core.schema import (
    ANSWER_RESPONSES,
    IDEMPOTENCY_RESPONSES,
    event_stream,
    idempotency_key_parameter,
)
from apps.core.tags import TAG_HELP, TAG_MAX_LENGTH, TAG_PATTERN
from apps.core.validation import MAX_ID, message_length_check, validated
from apps.knowledge.apis import SearchFiltersInput, search_mode_field
from apps.usage.tags import caller_tagged


class ConversationListCreateApi(APIView):
    required_scopes = {"GET": "read", "POST": "chat"}
    pagination_class = Pagination

    class InputSerializer(serializers.Serializer[dict[str, Any]]):
        title = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
        collections = serializers.ListField(
            child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
            required=False,
            max_length=100,
        )

    @extend_schema(responses=ConversationOutput(many=True))
    def get(self, request: Request) -> Response:
        """The team's conversations, most recent first."""
        paginator = self.pagination_class()
        conversations = selectors.conversation_list(team=get_caller(request).team)
        page = paginator.paginate_queryset(conversations, request, view=self)
        return paginator.get_paginated_response(ConversationOutput(page, many=True).data)

    @extend_schema(
        request=InputSerializer,
        responses={
            201: ConversationOutput,
            404: OpenApiResponse(description="not_found: a collection named is not the team's"),
        },
    )
    def post(self, request: Request) -> Response:
        """Start a conversation, optionally limited to some collections."""
        data = validated(self.InputSerializer, request)
        conversation = services.conversation_create(
            caller=get_caller(request),
            title=data["title"],
            collection_ids=data.get("collections"),
        )
        return Response(ConversationOutput(conversation).data, status=status.HTTP_201_CREATED)


class ConversationDetailApi(APIView):
    required_scopes = {"GET": "read", "DELETE": "chat"}

    @extend_schema(responses=ConversationDetailOutput)
    def get(self, request: Request, conversation_id: int) -> Response:
        """A conversation with its messages, their citations and usage."""
        conversation = selectors.conversation_get(
            team=get_caller(request).team, conversation_id=conversation_id
        )
        return Response(ConversationDetailOutput(conversation).data)

    @extend_schema(
        responses={
            204: None,
            403: OpenApiResponse(
                description="role_forbidden: a member's (or a key of no user's) delete of a "
                "conversation it did not start"
            ),
        }
    )
    def delete(self, request: Request, conversation_id: int) -> Response:
        """Delete a conversation and its messages: owners and admins any of the team's, a
        member those they started (signed in or with any of their keys), a key of no user
        those it started."""
        caller = get_caller(request)
        conversation = selectors.conversation_get(team=caller.team, conversation_id=conversation_id)
        role_require_own_or_manager(
            caller=caller,
            user_id=conversation.user_id,
            api_key_id=conversation.api_key_id,
            action="delete other members' conversations",
        )
        services.conversation_delete(conversation=conversation)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ConversationMessageCreateApi(AsyncApiView):
    required_scopes = {"POST": "chat"}
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    class InputSerializer(SamplingInput):
        content = serializers.CharField()
        collections = serializers.ListField(
            child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
            required=False,
            max_length=100,
        )
        model = serializers.CharField(required=False, max_length=64)
        max_tokens = serializers.IntegerField(required=False, min_value=1)
        top_k = serializers.IntegerField(
            required=False, min_value=0, max_value=settings.MAX_TOP_K, default=5
        )
        stream = serializers.BooleanField(required=False, default=False)
        reasoning = serializers.BooleanField(required=False, default=False)
        mode = search_mode_field()
        filters = SearchFiltersInput(required=False)
        tag = serializers.RegexField(
            TAG_PATTERN, max_length=TAG_MAX_LENGTH, required=False, help_text=TAG_HELP
        )
        stream_grace = serializers.FloatField(
            required=False,
            allow_null=True,
            min_value=0,
            max_value=settings.STREAM_DETACH_GRACE_MAX,
            help_text="seconds a streamed answer goes on after its client drops, to be "
            "resumed (GET …/events with Last-Event-ID); default STREAM_DETACH_GRACE, 0 "
            "stops it at once",
        )
        cache = serializers.BooleanField(
            required=False,
            default=True,
            help_text="false: skip the response cache (a first question in a conversation "
            "is answered from it when the same question, model, max_tokens and search met "
            "unchanged collections within RESPONSE_CACHE_TTL)",
        )

        def validate_content(self, content: str) -> str:
            # Its length is a question of context length: the model's window decides.
            message_length_check(content, param="content")
            return content

        @staticmethod
        def to_request(
            data: dict[str, Any], *, caller: Caller, model: services.ModelChoice, conversation: int
        ) -> services.AnswerRequest:
            """The answer ``data`` (validated) asks for in ``conversation``."""
            return services.AnswerRequest(
                caller=caller,
                model=model,
                content=data["content"],
                conversation=conversation,
                rag=data["top_k"] > 0,
                collection_ids=_ids(data.get("collections")),
                top_k=data["top_k"],
                search_mode=data["mode"],
                search_filters=data.get("filters"),
                max_tokens=data.get("max_tokens"),
                want_reasoning=data["reasoning"],
                cache=data["cache"],
                stream_grace=data.get("stream_grace"),
                **sampling_values(data),
            )

    @extend_schema(
        request=InputSerializer,
        parameters=[idempotency_key_parameter()],
        responses={
            **IDEMPOTENCY_RESPONSES,
            (201, "application/json"): AnswerOutput,
            (200, "text/event-stream"): event_stream(
                "Server-Sent Events: message, retrieval, delta, reasoning, usage, error, done",
                events=ANSWER_EVENTS,
            ),
            400: OpenApiResponse(
                description="context_length_exceeded, max_tokens_too_large (the model's or "
                "the caller's limit), request_exceeds_burst_capacity"
            ),
            **ANSWER_RESPONSES,
        },
    )
    async def post(self, request: Request, conversation_id: int) -> HttpResponseBase:
        """Ask a question in a conversation.

        With ``Accept: text/event-stream`` (or ``"stream": true``) the answer streams as
        Server-Sent Events; otherwise the answer is returned whole, with status 201.
        Everything that can fail (validation, limits, retrieval, context length, a full
        queue at the tier) fails before the first byte; later failures arrive in-band as
        an ``error`` event, then ``done``.
        """
        data = validated(self.InputSerializer, request)
        caller = await caller_tagged(get_caller(request), data.get("tag"))
        stream = data["stream"] or "text/event-stream" in request.headers.get("Accept", "")
        claim = await idempotency_request_aclaim(request=request, team=caller.team, body=data)
        if claim is not None and claim.status == IdempotencyKey.Status.COMPLETE:
            return await message_replay(caller=caller, claim=claim, stream=stream)
        try:
            model = await services.model_choose(alias=data.get("model"))
            asked = self.InputSerializer.to_request(
                data, caller=caller, model=model, conversation=conversation_id
            )
            prepared = await services.answer_ready(asked)
            return await answer_respond(prepared, wire=NativeWire(), stream=stream, claim=claim)
        except BaseException:
            if claim is not None:  # nothing to replay: a retry runs afresh
                await asyncio.shield(db_call(idempotency_release)(claim=claim))
            raise


async def message_replay(
    *, caller: Caller, claim: IdempotencyKey, stream: bool
) -> HttpResponseBase:
    """What a retry with the same ``Idempotency-Key`` gets: the first answer's events
    replayed (a stream), or its stored message (JSON) with the usage block and log
    probabilities its events hold; nothing generated or charged."""
    assert claim.resource_id is not None  # noqa: S101 - a completed claim names its message
    message = await db_call(selectors.message_get)(team=caller.team, message_id=claim.resource_id)
    events = await services.replay_open(team=caller.team, message_id=message.pk, after=0)
    response: HttpResponseBase
    if stream:
        response = _event_stream(events)
    else:
        stored = await services.answer_collect(stored_events(events))
        usage = stored.usage or selectors.message_usage(message=message)  # events expired
        body = {
            "id": message.pk,
            "content": message.content,
            "citations": message.citations,
            "usage": usage.as_dict(),
            "finish_reason": message.finish_reason,
            **({"logprobs": stored.logprobs} if stored.logprobs else {}),
        }
        response = Response(body, status=claim.response_status or status.HTTP_201_CREATED)
    response[REPLAYED_HEADER] = "true"
    return response


class MessageEventsApi(AsyncApiView):
    required_scopes = {"GET": "read"}
    # JSON first: an error for a client that did not ask for the stream is application/json.
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "Last-Event-ID",
                str,
                OpenApiParameter.HEADER,
                pattern=r"^[0-9]{1,18}$",
                description="resume after this event id",
            ),
            OpenApiParameter(
                "last_event_id",
                str,
                pattern=r"^[0-9]{1,18}$",
                description="resume after this event id (for EventSource, which cannot "
                "set the header); the header wins",
            ),
        ],
        responses={
            (200, "text/event-stream"): event_stream(
                "Server-Sent Events: the message's events after the given id, then live until done",
                events=ANSWER_EVENTS,
            ),
            429: OpenApiResponse(
                description="too_many_concurrent_streams: the team has REPLAY_MAX_PER_TEAM "
                "replays open; Retry-After and x-ratelimit-{limit,remaining,reset}-streams"
            ),
            503: OpenApiResponse(
                description="rate_limiter_unavailable (Redis down, failing closed), with "
                "Retry-After"
            ),
        },
    )
    async def get(self, request: Request, message_id: int) -> HttpResponseBase:
        """Replay an answer's events after ``Last-Event-ID`` (header or ``?last_event_id=``),
        following it live until ``done`` if it is still streaming.

        Each open replay holds one of the team's ``REPLAY_MAX_PER_TEAM`` replay slots until
        it ends or the client leaves; past them, 429 ``too_many_concurrent_streams``."""
        after = last_event_id(
            request.headers.get("Last-Event-ID"), request.query_params.get("last_event_id")
        )
        caller = get_caller(request)
        message = await db_call(selectors.message_get)(team=caller.team, message_id=message_id)
        events = await services.replay_open(team=caller.team, message_id=message.pk, after=after)
        return _event_stream(events)


def _event_stream(events: AsyncIterator[services.StoredEvent]) -> HttpResponseBase:
    """Stored events as they were first sent, with keep-alive pings, until ``done``."""
    frames = (frame_stored(seq, name, data) async for seq, name, data in events)
    return event_stream_response(with_pings(frames))


class MessageDetailApi(AsyncApiView):
    required_scopes = {"GET": "read"}

    @extend_schema(responses={200: MessageOutput})
    async def get(self, request: Request, message_id: int) -> Response:
        """A message and its ``status``; an answer still running (``streaming``, or
        ``detached``: generating with nobody reading, within its grace period) has the text
        so far as its ``content``, so a client that was stopped can show it on return."""
        team = get_caller(request).team
        message = await db_call(selectors.message_get)(team=team, message_id=message_id)
        if message.status in Message.RUNNING:
            message.content = await services.answer_text_so_far(message_id=message.pk)
        return Response(MessageOutput(message).data)


class MessageCancelApi(APIView):
    required_scopes = {"POST": "chat"}

    @extend_schema(request=None, responses={202: MessageOutput})
    def post(self, request: Request, message_id: int) -> Response:
        """Stop a running answer; the tokens generated so far are billed."""
        message = selectors.message_get(team=get_caller(request).team, message_id=message_id)
        services.message_cancel(message=message)
        return Response(MessageOutput(message).data, status=status.HTTP_202_ACCEPTED)


class TokenizeApi(APIView):
    required_scopes = {"POST": "read"}
    # Counting costs CPU, not tokens: its own request bucket on top of the team's.
    throttle_scope = "tokenize"

    class InputSerializer(serializers.Serializer[dict[str, Any]]):
        text = serializers.CharField(
            trim_whitespace=False, allow_blank=True, max_length=settings.MAX_JSON_BODY_BYTES
        )
        model = serializers.CharField(required=False, max_length=64)

    class OutputSerializer(serializers.Serializer[Any]):
        model = serializers.CharField()
        tokens = serializers.IntegerField()

    @extend_schema(
        request=InputSerializer,
        responses={
            200: OutputSerializer,
            404: OpenApiResponse(description="model_not_found: no such model alias"),
        },
    )
    def post(self, request: Request) -> Response:
        """Count ``text`` with the tokenizer of the model ``model`` names (the default
        model's when absent; for ``auto``, the small model's, its first choice)."""
        data = validated(self.InputSerializer, request)
        count = services.text_count(alias=data.get("model"), text=data["text"])
        return Response(self.OutputSerializer(count).data)


def _ids(ids: list[int] | None) -> tuple[int, ...] | None:
    return None if ids is None else tuple(ids)
