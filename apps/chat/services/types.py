"""The events an answer is made of.

Every surface consumes the same typed events: the SSE encoder frames them (``name`` and
``data()``), the JSON collector folds them, the OpenAI renderer re-shapes them. Nothing
matches event names as strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from apps.core.exceptions import ApplicationError, error_body
from apps.usage.values import Usage


class Citation(TypedDict):
    """A passage the prompt kept, numbered (``id``) as the prompt numbers it: the answer's
    ``retrieval`` event, its message row, the cached answer and both surfaces carry it."""

    id: int
    chunk_id: int
    document_id: int
    collection_id: int
    title: str
    chunk_index: int
    score: float
    snippet: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerEvent:
    """One event of an answer; ``id`` increases by one per event of a message."""

    name: ClassVar[str]
    id: int = 0

    def data(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, slots=True, kw_only=True)
class Started(AnswerEvent):
    name: ClassVar[str] = "message"
    message_id: int
    conversation_id: int
    model: str

    def data(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "conversation_id": self.conversation_id,
            "model": self.model,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Retrieved(AnswerEvent):
    name: ClassVar[str] = "retrieval"
    citations: list[Citation] = field(default_factory=list)

    def data(self) -> dict[str, Any]:
        return {"citations": self.citations}


@dataclass(frozen=True, slots=True, kw_only=True)
class Delta(AnswerEvent):
    """Answer text; with ``logprobs`` asked for, its tokens' entries in OpenAI's shape
    (``token``, ``logprob``, ``bytes``, ``top_logprobs``)."""

    name: ClassVar[str] = "delta"
    text: str
    logprobs: tuple[Mapping[str, Any], ...] = ()

    def data(self) -> dict[str, Any]:
        if self.logprobs:
            return {"text": self.text, "logprobs": list(self.logprobs)}
        return {"text": self.text}


@dataclass(frozen=True, slots=True, kw_only=True)
class Reasoning(AnswerEvent):
    name: ClassVar[str] = "reasoning"
    text: str

    def data(self) -> dict[str, Any]:
        return {"text": self.text}


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall(AnswerEvent):
    """A fragment of a function call the model makes (OpenAI's ``delta.tool_calls``):
    ``call_id`` and ``function`` on a call's first fragment, then pieces of ``arguments``,
    joined per ``index`` by whoever needs the whole call."""

    name: ClassVar[str] = "tool_call"
    index: int
    call_id: str | None = None
    function: str | None = None
    arguments: str = ""

    def data(self) -> dict[str, Any]:
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.function is not None:
            function["name"] = self.function
        call: dict[str, Any] = {"index": self.index, "function": function}
        if self.call_id is not None:
            call = {"index": self.index, "id": self.call_id, "type": "function", **call}
        return call


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageReport(AnswerEvent):
    name: ClassVar[str] = "usage"
    usage: Usage

    def data(self) -> dict[str, Any]:
        return self.usage.as_dict()


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed(AnswerEvent):
    """An error after the stream started, carried as the domain error itself so that every
    surface maps it through the one handler (status, code, ``Retry-After``)."""

    name: ClassVar[str] = "error"
    error: ApplicationError

    def data(self) -> dict[str, Any]:
        body: dict[str, Any] = error_body(
            type=self.error.type,
            code=self.error.code,
            message=self.error.message,
            param=self.error.param,
        )["error"]
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class Done(AnswerEvent):
    name: ClassVar[str] = "done"
    message_id: int
    finish_reason: str

    def data(self) -> dict[str, Any]:
        return {"message_id": self.message_id, "finish_reason": self.finish_reason}
