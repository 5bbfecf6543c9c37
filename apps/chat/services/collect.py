"""The non-streaming surfaces collect the same event stream the SSE surface sends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apps.chat.services.answers import PreparedAnswer, answer_events


@dataclass
class CollectedAnswer:
    message_id: int
    content: str = ""
    reasoning: str = ""
    citations: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "stop"
    error: dict[str, Any] | None = None
    """Set when the generation failed; with no content, the surface answers an error."""


async def answer_collect(prepared: PreparedAnswer) -> CollectedAnswer:
    answer = CollectedAnswer(message_id=prepared.message.pk)
    parts: list[str] = []
    thoughts: list[str] = []
    async for event in answer_events(prepared):
        match event.event:
            case "retrieval":
                answer.citations = event.data["citations"]
            case "delta":
                parts.append(event.data["text"])
            case "reasoning":
                thoughts.append(event.data["text"])
            case "usage":
                answer.usage = event.data
            case "error":
                answer.error = event.data
            case "done":
                answer.finish_reason = event.data["finish_reason"]
    answer.content, answer.reasoning = "".join(parts), "".join(thoughts)
    return answer
