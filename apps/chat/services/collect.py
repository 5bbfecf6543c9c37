"""The non-streaming surfaces collect the same event stream the SSE surface sends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from apps.chat.services.types import (
    AnswerEvent,
    Citation,
    Delta,
    Done,
    Failed,
    Reasoning,
    Retrieved,
    Started,
    ToolCall,
    UsageReport,
)
from apps.core.exceptions import ApplicationError
from apps.usage.values import Usage


@dataclass
class CollectedAnswer:
    message_id: int = 0
    content: str = ""
    reasoning: str = ""
    citations: list[Citation] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str = "stop"
    model: str = ""
    """The alias that served (after ``auto`` routing and fallback)."""
    error: ApplicationError | None = None
    """Set when the generation failed; with no content, the surface answers the error."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """The function calls made, whole, in OpenAI's shape (``id``, ``type``, ``function``
    with ``name`` and ``arguments``), in index order."""
    logprobs: list[Mapping[str, Any]] = field(default_factory=list)
    """The answer tokens' log probabilities, when asked for (OpenAI's
    ``logprobs.content``)."""


async def answer_collect(events: AsyncIterator[AnswerEvent]) -> CollectedAnswer:
    answer = CollectedAnswer()
    parts: list[str] = []
    thoughts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    async for event in events:
        match event:
            case Started(message_id=message_id, model=model):
                answer.message_id, answer.model = message_id, model
            case Retrieved(citations=citations):
                answer.citations = citations
            case Delta(text=text, logprobs=logprobs):
                parts.append(text)
                answer.logprobs.extend(logprobs)
            case Reasoning(text=text):
                thoughts.append(text)
            case ToolCall():
                _join(calls, event)
            case UsageReport(usage=usage):
                answer.usage, answer.model = usage, usage.model or answer.model
            case Failed(error=error):
                answer.error = error
            case Done(finish_reason=reason):
                answer.finish_reason = reason
    answer.content, answer.reasoning = "".join(parts), "".join(thoughts)
    answer.tool_calls = [calls[index] for index in sorted(calls)]
    return answer


def _join(calls: dict[int, dict[str, Any]], fragment: ToolCall) -> None:
    """``fragment`` added to its call: the id and name it brings, its arguments appended."""
    call = calls.setdefault(
        fragment.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if fragment.call_id is not None:
        call["id"] = fragment.call_id
    if fragment.function is not None:
        call["function"]["name"] = fragment.function
    call["function"]["arguments"] += fragment.arguments
