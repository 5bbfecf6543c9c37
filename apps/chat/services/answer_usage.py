"""What an answer used, as its usage block says and its metrics record.

:class:`Generation` gathers what the tier sends for one answer; :func:`usage_of` makes
the usage block from it (the tier's own counts when it sent them, else the exact local
count with the serving alias's tokenizer) and :func:`usage_observe` records that block in
the metrics. The settlement (:mod:`~apps.chat.services.settle`) writes it down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from apps.chat.models import Message
from apps.chat.services.prepare import PreparedAnswer
from apps.core.exceptions import ApplicationError
from apps.usage import metrics
from apps.usage.values import Usage
from inference import ModelEntry, UpstreamUsage


@dataclass
class Generation:
    """What the tier has sent for one answer so far, and when."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_text: list[str] = field(default_factory=list)
    """The function names and argument pieces of the tool calls: generated tokens too."""
    upstream: UpstreamUsage | None = None
    finish_reason: str | None = None
    started: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None


def usage_of(
    prepared: PreparedAnswer,
    generation: Generation,
    *,
    queued: float,
    served: ModelEntry,
    cache_hit: bool = False,
) -> Usage:
    """The usage block: the tier's own when it sent one, else the exact local count, with
    the tokenizer of the alias that served (a fallback alias counts its own prompt); for a
    cache hit, no token (nothing was generated: only the query's embedding, charged by the
    search, was spent)."""
    counter = served.tokenizer.load()
    count = counter.count
    reasoning_text = "".join(generation.reasoning)
    upstream = generation.upstream
    if cache_hit:
        prompt_tokens = cached_tokens = completion_tokens = reasoning_tokens = 0
    elif upstream is not None:
        prompt_tokens, completion_tokens = upstream.prompt_tokens, upstream.completion_tokens
        # A server without a per-team cache salt counts hits on any tenant's prefix: its
        # figure would let one team confirm another's prompt, so it is reported as 0.
        cached_tokens = upstream.cached_tokens if served.takes_cache_salt else 0
        if upstream.reasoning_tokens is not None:
            reasoning_tokens = upstream.reasoning_tokens
        else:
            reasoning_tokens = (
                min(count(reasoning_text), completion_tokens) if reasoning_text else 0
            )
    else:
        prompt_tokens, cached_tokens = prepared.prompt.prompt_tokens, 0
        if served.tokenizer != prepared.spec.entry.tokenizer:
            prompt_tokens = counter.count_chat(
                prepared.prompt.messages, tools=prepared.prompt.tools
            )
        reasoning_tokens = count(reasoning_text) if reasoning_text else 0
        answer = "".join(generation.text)
        calls = "".join(generation.tool_text)
        completion_tokens = reasoning_tokens + (count(answer) if answer else 0)
        completion_tokens += count(calls) if calls else 0
    now = time.monotonic()
    first = generation.first_token
    decode = now - (first or now)
    return Usage(
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        reasoning_tokens=reasoning_tokens,
        ttft_ms=round((first - generation.started) * 1000) if first is not None else None,
        duration_ms=round((now - generation.started) * 1000),
        tokens_per_second=round(completion_tokens / decode, 2)
        if decode > 0 and not cache_hit
        else None,
        queue_ms=round(queued * 1000),
        model=served.alias,
        source="upstream" if upstream is not None else "counted",
        cache_hit=cache_hit,
        **_window(prepared),
    )


def _window(prepared: PreparedAnswer) -> dict[str, Any]:
    """How full the answer's window ran, what it left out, and the usage's tag."""
    return {
        "context_window": prepared.spec.context_window,
        "dropped_passages": prepared.dropped_passages,
        "dropped_turns": prepared.dropped_turns,
        "summarized_turns": prepared.summarized_turns,
        "dropped_tokens": prepared.dropped_tokens,
        "tag": prepared.caller.tag,
    }


def usage_observe(usage: Usage, status: str, error: ApplicationError | None) -> None:
    model = usage.model
    if usage.context_window and not usage.cache_hit:
        metrics.CONTEXT_FILL.labels(model).observe(usage.prompt_tokens / usage.context_window)
    if usage.ttft_ms is not None and not usage.cache_hit:  # a replay's TTFT is the cache's
        metrics.TTFT.labels(model).observe(usage.ttft_ms / 1000)
    if usage.tokens_per_second is not None:
        metrics.OUTPUT_TOKENS_PER_SECOND.labels(model).observe(usage.tokens_per_second)
    metrics.TOKENS.labels("chat", model, "input").inc(usage.prompt_tokens)
    metrics.TOKENS.labels("chat", model, "output").inc(usage.completion_tokens)
    if status == Message.Status.FAILED and error is not None:
        metrics.UPSTREAM_ERRORS.labels(error.code).inc()
