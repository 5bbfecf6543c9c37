"""The non-streaming surfaces collect the same event stream the SSE surface sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from apps.chat.services.types import (
    AnswerEvent,
    Citation,
    Delta,
    Done,
    Failed,
    Reasoning,
    Retrieved,
    Started,
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


async def answer_collect(events: AsyncIterator[AnswerEvent]) -> CollectedAnswer:
    answer = CollectedAnswer()
    parts: list[str] = []
    thoughts: list[str] = []
    async for event in events:
        match event:
            case Started(message_id=message_id, model=model):
                answer.message_id, answer.model = message_id, model
            case Retrieved(citations=citations):
                answer.citations = citations
            case Delta(text=text):
                parts.append(text)
            case Reasoning(text=text):
                thoughts.append(text)
            case UsageReport(usage=usage):
                answer.usage, answer.model = usage, usage.model or answer.model
            case Failed(error=error):
                answer.error = error
            case Done(finish_reason=reason):
                answer.finish_reason = reason
    answer.content, answer.reasoning = "".join(parts), "".join(thoughts)
    return answer
