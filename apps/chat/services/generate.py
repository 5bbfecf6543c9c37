"""The answer's events as the tier generates them: ``Started``, ``Retrieved``,
``Delta``/``Reasoning``, then ``Failed`` if the tier failed, ``UsageReport`` and ``Done``
(always last), inside the :class:`~.run.AnswerRun` that settles it however it ends."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from apps.chat.models import Message
from apps.chat.services.run import AnswerRun
from apps.chat.services.types import (
    AnswerEvent,
    Delta,
    Failed,
    Reasoning,
    Retrieved,
    ToolCall,
)
from apps.core.exceptions import InvalidRequest, as_application_error, mid_stream_error
from apps.usage import metrics
from inference import (
    Finished,
    InferenceError,
    Interrupted,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamUsage,
)

logger = logging.getLogger(__name__)


class ReasoningBudgetExhausted(InvalidRequest):
    code = "reasoning_budget_exhausted"


async def answer_events(run: AnswerRun) -> AsyncIterator[AnswerEvent]:
    """The answer's events; the caller may stop iterating at any time (client gone)."""
    prepared, generation = run.prepared, run.generation
    upstream = run.upstream
    calls: set[int] = set()  # the tool calls begun
    async with run:
        try:
            yield run.emit(run.open())
            yield run.emit(Retrieved(citations=prepared.citations))
            try:
                async for event in upstream:
                    match event:
                        case TextDelta(text=text) | ReasoningDelta(text=text):
                            _tick(run, time.monotonic())
                            if isinstance(event, TextDelta):
                                generation.text.append(text)
                                yield run.emit(Delta(text=text, logprobs=event.logprobs))
                            else:
                                generation.reasoning.append(text)
                                if prepared.want_reasoning:
                                    yield run.emit(Reasoning(text=text))
                            run.write_rows()  # the first token is out
                        case ToolCallDelta():
                            _tick(run, time.monotonic())
                            yield run.emit(_tool_call(event, generation.tool_text, calls))
                            run.write_rows()
                        case Finished(reason=reason):
                            # vLLM ends a call to a named function with "stop" and one of
                            # tool_choice "required" with "tool_calls"; llama.cpp says
                            # "tool_calls" for both: an answer that calls says so, always.
                            called = calls and reason == "stop"
                            generation.finish_reason = "tool_calls" if called else reason
                        case UpstreamUsage():
                            generation.upstream = event
                    if run.cancel_requested:
                        run.end(Message.Status.CANCELLED, "cancelled")
                        break
            except Interrupted:  # a cancel or a delete, while the tier prefilled or stalled
                run.end(Message.Status.CANCELLED, "cancelled")
            except InferenceError as exc:
                run.end(Message.Status.FAILED, "error", error=as_application_error(exc))
            except Exception as exc:  # anything else mid-stream: said in-band, then settled
                logger.exception("answer %s failed mid-stream", run.message_id)
                run.end(Message.Status.FAILED, "error", error=mid_stream_error(exc))
        finally:
            await upstream.aclose()  # closing the connection stops the tier generating
            await run.lease.release()  # the next request in the queue may go now
        if generation.finish_reason == "length" and generation.reasoning and not generation.text:
            run.error = ReasoningBudgetExhausted(
                "max_tokens ran out during reasoning, before any answer token."
            )
        if run.error is not None:
            run.status = Message.Status.FAILED
            yield run.emit(Failed(error=run.error))
        for ending in await run.settle():
            yield ending


def _tool_call(fragment: ToolCallDelta, generated: list[str], begun: set[int]) -> ToolCall:
    """``fragment`` as OpenAI streams it: the call's id and name on its first fragment
    only (llama-cpp-python repeats them on every one, which OpenAI's clients would join),
    its text kept among what was ``generated``."""
    first = fragment.index not in begun
    begun.add(fragment.index)
    name = fragment.name if first else None
    generated.append((name or "") + fragment.arguments)
    return ToolCall(
        index=fragment.index,
        call_id=fragment.id if first else None,
        function=name,
        arguments=fragment.arguments,
    )


def _tick(run: AnswerRun, now: float) -> None:
    generation = run.generation
    if generation.first_token is None:
        generation.first_token = now
    elif generation.last_token is not None and run.cached is None:
        metrics.INTER_TOKEN.labels(run.prepared.spec.alias).observe(now - generation.last_token)
    generation.last_token = now
