"""What one chat generation asks of a tier (:class:`ChatRequest`) and the typed events it
streams back, whichever server sends them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from inference.tokenizers import ChatMessage


@dataclass(slots=True)
class ChatRequest:
    model: str
    messages: Sequence[ChatMessage]
    max_tokens: int
    temperature: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    reasoning_opened: bool = False
    """The chat template opens the thinking block in the prompt (DeepSeek-R1 style): the
    output starts inside it and only a closing ``</think>`` shows."""
    cache_salt: str | None = field(default=None, repr=False)
    """vLLM's ``cache_salt``: prefix-cache blocks are shared only between requests with
    the same salt, so one tenant's prompts cannot be probed through another's cache hits.
    Set only for servers that take it (see ``registry.CACHE_SALT_SERVERS``)."""

    def for_model(
        self,
        *,
        model: str,
        max_tokens: int,
        reasoning_opened: bool,
        cache_salt: str | None = None,
    ) -> ChatRequest:
        """The same request for another served model (a fallback alias's), salted for
        that model's server or not (``cache_salt``)."""
        return replace(
            self,
            model=model,
            max_tokens=max_tokens,
            reasoning_opened=reasoning_opened,
            cache_salt=cache_salt,
        )

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(self.messages),
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra,
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.cache_salt is not None:
            body["cache_salt"] = self.cache_salt
        return body


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    reason: str | None


@dataclass(frozen=True, slots=True)
class UpstreamUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int | None = None
    """None when the tier does not report it (then it is counted locally)."""


Event = TextDelta | ReasoningDelta | Finished | UpstreamUsage
