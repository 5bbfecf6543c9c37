"""What one chat generation asks of a tier (:class:`ChatRequest`) and the typed events it
streams back, whichever server sends them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from typing import Any

from inference.tokenizers import ChatMessage, ToolDefinition


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """How the caller asked the tokens to be chosen, in OpenAI's terms and bounds (the
    surfaces check them). None leaves the server's default. Each server's dialect is
    written, or a field it cannot honour named, by :mod:`inference.dialects`
    (:func:`~inference.dialects.sampling_wire`, :func:`~inference.dialects.sampling_refused`)."""

    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[str, float], ...] | None = None
    """Token id (as OpenAI writes it, a string) and bias, -100 to 100."""
    response_format: Mapping[str, Any] | None = None
    """OpenAI's ``{"type": "text" | "json_object"}`` or ``{"type": "json_schema",
    "json_schema": {"name", "schema", "strict"?}}``."""
    user: str | None = None
    """The caller's end user, for the tier's own abuse tracking; it changes no output."""
    logprobs: bool | None = None
    """Return each answer token's log probability (:attr:`TextDelta.logprobs`)."""
    top_logprobs: int | None = None
    """And the ``top_logprobs`` likeliest tokens at each position, 0 to 20."""

    def fields(self) -> dict[str, Any]:
        """The fields set, by their OpenAI names."""
        chosen = ((spec.name, getattr(self, spec.name)) for spec in dataclass_fields(self))
        return {name: value for name, value in chosen if value is not None}


@dataclass(frozen=True, slots=True, kw_only=True)
class Tools:
    """The functions the model may call and how (OpenAI's ``tools``, ``tool_choice`` and
    ``parallel_tool_calls``; the surfaces check their shape and size). vLLM, llama.cpp,
    Ollama's /v1 and TGI take them as OpenAI writes them; a server that cannot is named by
    :func:`~inference.dialects.tools_refused`."""

    definitions: tuple[ToolDefinition, ...]
    choice: str | Mapping[str, Any] | None = None
    """``none``, ``auto``, ``required`` or ``{"type": "function", "function": {"name"}}``;
    None leaves the server's default (``auto`` with tools)."""
    parallel: bool | None = None
    """``parallel_tool_calls``; None leaves the server's default (allowed)."""

    def fields(self) -> dict[str, Any]:
        """The fields set, by their OpenAI names, as the wire carries them."""
        wire: dict[str, Any] = {"tools": [dict(tool) for tool in self.definitions]}
        if self.choice is not None:
            wire["tool_choice"] = self.choice
        if self.parallel is not None:
            wire["parallel_tool_calls"] = self.parallel
        return wire


@dataclass(slots=True)
class ChatRequest:
    model: str
    messages: Sequence[ChatMessage]
    max_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    tools: Tools | None = None
    server: str = "other"
    """What the upstream runs (``registry.SERVERS``): the dialect ``sampling`` is written
    in (:func:`inference.dialects.sampling_wire`)."""
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
        server: str | None = None,
    ) -> ChatRequest:
        """The same request for another served model (a fallback alias's), salted for
        that model's server or not (``cache_salt``), in that server's dialect (``server``;
        None: the same server)."""
        return replace(
            self,
            model=model,
            max_tokens=max_tokens,
            reasoning_opened=reasoning_opened,
            cache_salt=cache_salt,
            server=self.server if server is None else server,
        )

    def body(self) -> dict[str, Any]:
        """The request without its sampling fields, which the client adds in the
        server's dialect."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(self.messages),
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra,
        }
        if self.cache_salt is not None:
            body["cache_salt"] = self.cache_salt
        if self.tools is not None:
            body.update(self.tools.fields())
        return body


TokenLogprob = Mapping[str, Any]
"""One answer token's entry as OpenAI writes it: ``token``, ``logprob``, ``bytes`` (a list
of ints, or None) and ``top_logprobs`` (the same three for each likely token)."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    """The entries of the tokens in ``text``, when the caller asked for them."""


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of a function call, as OpenAI streams it: the call's ``index`` in the
    message, its ``id`` and ``name`` on its first fragment, then pieces of ``arguments``
    (a JSON text only once joined)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


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


Event = TextDelta | ReasoningDelta | ToolCallDelta | Finished | UpstreamUsage
