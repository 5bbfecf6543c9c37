"""``Idempotency-Key`` on ``POST /v1/chat/completions``: the key claimed before an answer
is prepared, and what a retry with the same key and body gets back (the first answer,
re-framed; nothing generated or charged).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponseBase
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.selectors import Caller
from apps.chat import selectors, services
from apps.chat.services import CollectedAnswer, answer_collect
from apps.chat.sse import event_stream_response, with_pings
from apps.chat.wire import OpenAIWire, openai_completion, stored_events
from apps.core.aio import db_call
from apps.core.exceptions import InvalidRequest
from apps.core.idempotency import REPLAYED_HEADER, idempotency_key_of, idempotency_request_aclaim
from apps.core.models import IdempotencyKey


async def completion_claim(
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
    as a ``chat.completion`` (JSON), with the tool calls and log probabilities its events
    hold; nothing generated or charged."""
    assert claim.resource_id is not None  # noqa: S101 - a completed claim names its message
    message = await db_call(selectors.message_get)(team=caller.team, message_id=claim.resource_id)
    stored = await services.replay_open(team=caller.team, message_id=message.pk, after=0)
    response: HttpResponseBase
    if stream:
        response = event_stream_response(with_pings(wire.frames(stored_events(stored))))
    else:
        events = await answer_collect(stored_events(stored))
        answer = CollectedAnswer(
            message_id=message.pk,
            content=message.content,
            reasoning=message.reasoning,
            citations=message.citations,
            usage=selectors.message_usage(message=message),
            finish_reason=message.finish_reason,
            model=message.model,
            tool_calls=events.tool_calls,
            logprobs=events.logprobs,
        )
        response = Response(openai_completion(answer), status=claim.response_status or 200)
    response[REPLAYED_HEADER] = "true"
    return response
