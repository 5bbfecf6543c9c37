"""How each OpenAI-compatible server speaks, read in one place: its errors, its usage
block, its finish reasons and its context window.

Every server's error dialect is read by :func:`upstream_error`: vLLM's ``"code": 400``
(an integer), llama.cpp's ``"code": "context_length_exceeded"``, TGI's 422 and its
``error_type`` (and its in-stream ``http_status_code``), Triton's FastAPI ``{"detail":
"..."}``, a bare ``{"error": "..."}``. What the tier said goes to the log; what the caller
reads is this package's own message, never an upstream URL or text. Finish reasons are
read in one place too (TGI's ``eos_token`` and ``stop_sequence`` are a ``stop``), the
context window wherever the server tells it (vLLM's ``max_model_len``, Ollama's
``/api/show``: :func:`ollama_context_window`), and the sampling fields each server takes
(:func:`sampling_refused`, :func:`sampling_wire`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from inference.chat import Sampling, Tools, UpstreamUsage
from inference.errors import (
    ContextLengthExceeded,
    InferenceError,
    InferenceTimeout,
    InferenceUnavailable,
    UpstreamRateLimited,
    UpstreamRejected,
)

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 409, 425, 500, 502, 503, 504})
# What servers say when the prompt does not fit: vLLM "maximum context length", llama.cpp
# "exceeds the available context size", TGI "must be <= 4096" on tokens and "`inputs` must
# have less than 4096 tokens", Ollama "context".
CONTEXT_ERROR = re.compile(
    r"context[ _](length|window|size)|maximum context|tokens? \+ `?max_new_tokens`? must be"
    r"|`?inputs`? must have less than \d+ tokens",
    re.IGNORECASE,
)
# What servers say when they do not serve the model asked for: vLLM's 404 "The model `x`
# does not exist", Ollama's 404 'model "x" not found', Triton's 400 "Unknown model: x".
# The deployment is misconfigured: the tier failed (502), not the caller's request.
MODEL_MISSING = re.compile(r"unknown model|model .{0,200}(does not exist|not found)", re.I)
# Finish reasons other than OpenAI's that mean the same: TGI's end of sequence and stop
# sequences (its Messages API formats the first as "stop" since 1.4, the second never).
FINISH_REASONS = {"eos_token": "stop", "stop_sequence": "stop"}
OLLAMA_DEFAULT_NUM_CTX = 4096
"""Ollama's num_ctx when neither the model nor the server sets one (2048 before 0.6; a
larger one on big GPUs since 0.12, or ``OLLAMA_CONTEXT_LENGTH``): the safe assumption."""

SAMPLING_REFUSED: Mapping[str, frozenset[str]] = {
    # Ollama's /v1 lists logit_bias among what it does not support and ignores it.
    "ollama": frozenset({"logit_bias"}),
    # TGI's Messages API parses logit_bias and never applies it.
    "tgi": frozenset({"logit_bias"}),
    # Triton's OpenAI frontend refuses logit_bias and log probabilities and has no
    # structured output.
    "triton": frozenset({"logit_bias", "logprobs", "top_logprobs", "response_format"}),
}
"""The sampling fields a server cannot honour: a request that sets one is refused with
the field named (:func:`sampling_refused`), never sent without it."""
TOOLS_REFUSED: Mapping[str, frozenset[str]] = {
    # Triton's OpenAI frontend parses tool calls only with a per-model parser chosen at
    # its start, which nothing here can see: a request with tools is refused, not risked.
    "triton": frozenset({"tools"}),
    # Ollama's /v1 takes tools but not tool_choice or parallel_tool_calls (it drops them).
    "ollama": frozenset({"tool_choice", "parallel_tool_calls"}),
    # TGI's Messages API has no parallel_tool_calls.
    "tgi": frozenset({"parallel_tool_calls"}),
}
"""The tool fields a server cannot honour (:func:`tools_refused`); vLLM and llama.cpp
take all of them as OpenAI writes them."""
USER_SERVERS = frozenset({"vllm", "llama.cpp", "other"})
"""Servers whose OpenAI route takes ``user``; to the others it is not sent (it is the
caller's end user for abuse tracking and changes no output, so nothing is lost)."""

# How each transport failure is named to the caller, most specific first.
_TRANSPORT_FAILURES: tuple[tuple[type[httpx.HTTPError], str], ...] = (
    (httpx.ConnectTimeout, "the connection timed out"),
    (httpx.TimeoutException, "it did not answer in time"),
    (httpx.ConnectError, "the connection was refused or failed"),
    (httpx.RemoteProtocolError, "the connection broke off"),
    (httpx.UnsupportedProtocol, "its URL is not usable"),
    (httpx.HTTPError, "the connection failed"),
)


def transport_failure(exc: httpx.HTTPError) -> InferenceError:
    """The error a transport failure means, named by its kind only: the exception's text
    holds the upstream's host and address, which the log keeps and the caller never sees
    (the caller learns the alias, not where it is served)."""
    what = next(text for kind, text in _TRANSPORT_FAILURES if isinstance(exc, kind))
    logger.info("inference tier transport failure: %r", exc)
    error = InferenceTimeout if isinstance(exc, httpx.TimeoutException) else InferenceUnavailable
    return error(f"The inference tier could not be reached: {what}.")


def usage_from(raw: object) -> UpstreamUsage | None:
    """A tier's usage block in this package's one convention: cached tokens are part of the
    prompt tokens and reasoning tokens part of the completion tokens, whichever way the
    server counts them. None when ``raw`` is no usage block.

    - OpenAI, vLLM, llama.cpp, TGI, Ollama: ``prompt_tokens`` include
      ``prompt_tokens_details.cached_tokens``; ``completion_tokens`` include
      ``completion_tokens_details.reasoning_tokens``. Already the convention.
    - Google (Gemini): ``thoughts_token_count`` is apart from the candidates'
      ``completion_tokens``, so it is added to them; its cached tokens
      (``cached_content_token_count``) are within the prompt's.
    - Anthropic: ``input_tokens`` leave out ``cache_read_input_tokens`` and
      ``cache_creation_input_tokens``, so they are added to them; ``output_tokens`` include
      the thinking, which has no count of its own (counted locally).
    """
    if not isinstance(raw, Mapping):
        return None
    details = raw.get("completion_tokens_details") or {}
    if "prompt_tokens" in raw:
        prompt = _count(raw["prompt_tokens"])
        completion = _count(raw.get("completion_tokens"))
        cached = _count((raw.get("prompt_tokens_details") or {}).get("cached_tokens"))
        reasoning = details.get("reasoning_tokens")
        thoughts = raw.get("thoughts_token_count")
        if thoughts is not None and reasoning is None:  # Google: thoughts beside the answer
            reasoning = thoughts
            completion += _count(thoughts)
        cached = max(cached, _count(raw.get("cached_content_token_count")))
    elif "input_tokens" in raw:  # Anthropic
        cache_read = _count(raw.get("cache_read_input_tokens"))
        prompt = _count(raw["input_tokens"]) + cache_read
        prompt += _count(raw.get("cache_creation_input_tokens"))
        completion, cached, reasoning = _count(raw.get("output_tokens")), cache_read, None
    else:
        return None
    return UpstreamUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=min(cached, prompt),
        reasoning_tokens=min(_count(reasoning), completion) if reasoning is not None else None,
    )


def _count(value: object) -> int:
    return max(0, int(value)) if isinstance(value, (int, float)) else 0


def upstream_error(status: int | None, body: str, headers: Mapping[str, str]) -> InferenceError:
    """The error a tier's answer means, whichever server's dialect it is in. ``status`` is
    None for an error line inside a stream that had started."""
    message, code, kind = body[:500], "", ""
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(parsed, dict) and "error_type" in parsed:  # TGI
        kind = str(parsed["error_type"])
    if isinstance(error, dict):
        message = str(error.get("message", message))
        code, kind = str(error.get("code") or ""), str(error.get("type") or "")
        # TGI labels every in-stream error 422 (``http_status_code``): it says nothing.
        status = status or _int(error.get("code"))
    elif isinstance(error, str):
        message = error
    elif isinstance(parsed, dict) and isinstance(parsed.get("detail"), str):  # FastAPI: Triton
        message = parsed["detail"]
    logger.warning("inference tier answered %s: %s", status or "an error", message)
    retry_after = _retry_after(headers.get("retry-after"))
    if code == "context_length_exceeded" or (
        status in (None, 400, 413, 422) and CONTEXT_ERROR.search(message)
    ):
        return ContextLengthExceeded(
            "The prompt and max_tokens do not fit the model's context window."
        )
    if status in (400, 404) and MODEL_MISSING.search(message):
        return InferenceError("The inference tier does not serve the configured model.")
    if status == 429:
        return UpstreamRateLimited(
            "The inference tier is rate limiting this service; retry later.",
            retry_after=retry_after,
        )
    if status in (400, 422) or kind in ("invalid_request_error", "validation"):
        return UpstreamRejected("The inference tier rejected the request as invalid.")
    if status in RETRYABLE_STATUS:
        return InferenceUnavailable(
            f"The inference tier is unavailable (HTTP {status}).", retry_after=retry_after
        )
    if status is None:
        return InferenceError("The inference tier reported an error mid-answer.")
    return InferenceError(f"The inference tier failed (HTTP {status}).")


def ollama_context_window(show: Mapping[str, Any], *, model: str = "") -> int | None:
    """The prompt window Ollama really serves, from its ``/api/show`` answer: the model's
    ``num_ctx`` parameter (else the server's default, :data:`OLLAMA_DEFAULT_NUM_CTX`),
    never more than the model was trained for (``model_info["<arch>.context_length"]``).

    Ollama silently truncates a prompt longer than ``num_ctx`` (it keeps the start and the
    end and drops the middle, logging only on the server), so a ``num_ctx`` below the
    model's own context is warned about here: prompts are fitted to it instead."""
    info = show.get("model_info") or {}
    arch = info.get("general.architecture")
    trained = _int_or_none(info.get(f"{arch}.context_length")) if arch else None
    num_ctx = None
    for line in str(show.get("parameters") or "").splitlines():
        name, _, value = line.strip().partition(" ")
        if name == "num_ctx":
            num_ctx = _int_or_none(value.strip())
    window = num_ctx or OLLAMA_DEFAULT_NUM_CTX
    if trained is not None and window < trained:
        logger.warning(
            "Ollama serves %s with num_ctx %d (%s) below the model's context of %d tokens: "
            "it silently truncates longer prompts, so prompts are fitted to %d; raise num_ctx "
            "(PARAMETER num_ctx in a Modelfile) to use more",
            model or "the model",
            window,
            "its parameter" if num_ctx else "the server's default",
            trained,
            window,
        )
    return min(window, trained) if trained is not None else window


def _int_or_none(value: object) -> int | None:
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and 100 <= value <= 599 else None


def _retry_after(value: str | None) -> float | None:
    """Seconds from ``Retry-After`` in either of its forms: delay-seconds or an HTTP-date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def sampling_refused(server: str, sampling: Sampling) -> str | None:
    """The first field of ``sampling`` that ``server`` cannot honour, or None. A
    ``response_format`` of ``text`` is the default everywhere, so never refused; TGI takes
    no ``top_p`` of 0 (its nucleus must be above 0)."""
    refused = SAMPLING_REFUSED.get(server, frozenset())
    for name in sampling.fields():
        if name == "response_format" and _format_type(sampling) == "text":
            continue
        if name in refused:
            return name
    if server == "tgi" and sampling.top_p == 0:
        return "top_p"
    return None


def sampling_wire(server: str, sampling: Sampling) -> dict[str, Any]:
    """``sampling`` as ``server``'s OpenAI-compatible route takes it (check
    :func:`sampling_refused` first: a refused field is left out here).

    - vLLM and others: OpenAI's fields as they are.
    - llama.cpp (its server and llama-cpp-python's): a ``json_schema`` format becomes
      ``{"type": "json_object", "schema": …}``, the form both constrain decoding with;
      ``logprobs`` goes with a ``top_logprobs`` (0 when not asked), without which
      llama-cpp-python returns none.
    - Ollama's /v1: OpenAI's fields, which it maps to its ``options`` (temperature, top_p,
      stop, seed, penalties) and its ``format`` (``json`` or the schema) itself.
    - TGI: a JSON format is its grammar ``{"type": "json_object", "value": schema}`` (any
      object for ``json_object``); a ``top_p`` of 1 is no nucleus filtering, which TGI
      refuses to be asked for, so it is left out.
    - Triton: OpenAI's fields.
    """
    refused = SAMPLING_REFUSED.get(server, frozenset())
    wire = {name: value for name, value in sampling.fields().items() if name not in refused}
    if "stop" in wire:
        wire["stop"] = list(wire["stop"])
    if "logit_bias" in wire:
        wire["logit_bias"] = dict(wire["logit_bias"])
    if server not in USER_SERVERS:
        wire.pop("user", None)
    kind = _format_type(sampling)
    if kind == "text":
        wire.pop("response_format", None)
    elif kind is not None and server in ("llama.cpp", "tgi"):
        wire["response_format"] = _json_grammar(server, sampling)
    if server == "tgi" and sampling.top_p is not None and sampling.top_p >= 1:
        del wire["top_p"]
    if server == "llama.cpp" and sampling.logprobs:
        wire.setdefault("top_logprobs", 0)  # llama-cpp-python returns none without it
    return wire


def _format_type(sampling: Sampling) -> str | None:
    return None if sampling.response_format is None else str(sampling.response_format["type"])


def _json_grammar(server: str, sampling: Sampling) -> dict[str, Any]:
    """llama.cpp's or TGI's form of a JSON ``response_format``."""
    assert sampling.response_format is not None  # noqa: S101 - the caller checked
    schema = (sampling.response_format.get("json_schema") or {}).get("schema")
    if server == "tgi":
        return {"type": "json_object", "value": schema or {"type": "object"}}
    return {"type": "json_object", **({"schema": schema} if schema is not None else {})}


def tools_refused(server: str, tools: Tools | None) -> str | None:
    """The first tool field of ``tools`` that ``server`` cannot honour, or None. A
    ``tool_choice`` of ``auto`` is every server's default with tools, so never refused."""
    if tools is None:
        return None
    refused = TOOLS_REFUSED.get(server, frozenset())
    for name in tools.fields():
        if name == "tool_choice" and tools.choice == "auto":
            continue
        if name in refused:
            return name
    return None
