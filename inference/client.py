"""An async client for OpenAI-compatible inference servers (llama.cpp, vLLM, Ollama, TGI,
Triton's OpenAI frontend).

Always streams, with ``stream_options.include_usage``, and turns the wire into typed
events. Split timeouts: connect, first token, idle between chunks, and total. Retries
with exponential backoff and full jitter (honouring ``Retry-After``) happen only before
the first event has been handed to the caller; after that a failure is final, so no text
is ever duplicated. Every ``httpx`` error is wrapped in :mod:`inference.errors`.

Every server's error dialect is read in one place (:func:`upstream_error`): vLLM's
``"code": 400`` (an integer), llama.cpp's ``"code": "context_length_exceeded"``, TGI's 422
and its ``error_type`` (and its in-stream ``http_status_code``), Triton's FastAPI
``{"detail": "..."}``, a bare ``{"error": "..."}``. What the tier said goes to the log;
what the caller reads is this package's own message, never an upstream URL or text.
Finish reasons are read in one place too (TGI's ``eos_token`` and ``stop_sequence`` are
a ``stop``), and the context window wherever the server tells it (:meth:`OpenAIClient.
context_window`: vLLM's ``max_model_len``, Ollama's ``/api/show``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import random
import re
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, aclosing, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, cast

import httpx
import orjson

from inference.errors import (
    ContextLengthExceeded,
    InferenceError,
    InferenceTimeout,
    InferenceUnavailable,
    Interrupted,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamRejected,
)
from inference.reasoning import ThinkSplitter
from inference.tokenizers import ChatMessage
from inference.transport import READ_ON_DEMAND, AiohttpTransport

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


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 5.0
    first_token: float = 120.0
    idle: float = 60.0
    total: float = 900.0


@dataclass(frozen=True, slots=True)
class Retry:
    attempts: int = 3
    base_delay: float = 0.25
    max_delay: float = 8.0

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``; None: do not retry. A tier's
        ``Retry-After`` is honoured in full: waited out when short, else handed on."""
        if retry_after is not None:
            return retry_after if retry_after <= self.max_delay else None
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))  # noqa: S311


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


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """Built once: loading the CA bundle costs 20-40 ms, on the event loop, per client."""
    return ssl.create_default_context()


class OpenAIClient:
    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None = None,
        timeouts: Timeouts | None = None,
        retry: Retry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        read_interval: float = 0.0,
    ) -> None:
        """``read_interval``: the shortest time, in seconds, between two reads of one
        stream. Tokens that come faster wait in the transport's buffer and go on together
        (merged deltas), at most that much later; a slower stream is read token by token.
        Each read becomes one delta downstream, and a delta costs the process the same
        work (events, journal, SSE frame, socket write) whatever text it holds, so this
        bounds that work per stream when a tier streams faster than anyone reads (vLLM's
        stream interval does the same on the tier's side). The first token is never held."""
        self.timeouts = timeouts or Timeouts()
        self.retry = retry or Retry()
        self.read_interval = read_interval
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Shared by every answer of a process (see inference.transport).
        self._transport = transport or AiohttpTransport(ssl_context=_ssl_context())
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/",
            headers=headers,
            transport=self._transport,
            trust_env=False,
            timeout=httpx.Timeout(
                connect=self.timeouts.connect,
                read=self.timeouts.idle,
                write=self.timeouts.connect,
                pool=self.timeouts.connect,
            ),
        )
        # What every generation request carries, made once: the answer's request goes
        # straight to the transport (httpx's URL and header merging and its send() chain
        # cost 0.15-0.2 ms here, before the first token, for nothing a chat stream uses).
        self._chat_url = self._http.base_url.join("chat/completions")
        self._chat_headers = [
            *self._http.headers.multi_items(),
            ("Content-Type", "application/json"),
        ]
        # Read on demand: the stream is read when _attempt asks, each read timed there.
        self._chat_extensions = {"timeout": self._http.timeout.as_dict(), READ_ON_DEMAND: True}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def models(self) -> list[dict[str, Any]]:
        try:
            response = await self._http.get("models")
        except httpx.HTTPError as exc:
            raise transport_failure(exc) from exc
        if response.status_code != 200:
            raise upstream_error(response.status_code, response.text, response.headers)
        data = response.json().get("data", [])
        return [item for item in data if isinstance(item, dict)]

    async def context_window(self, served_name: str) -> int | None:
        """The context window the tier serves ``served_name`` with, or None when it does not
        say: vLLM's ``max_model_len`` in ``/v1/models``, else Ollama's ``/api/show`` (at
        the server root), read by :func:`ollama_context_window`."""
        for model in await self.models():
            if model.get("id") == served_name and model.get("max_model_len"):
                return int(model["max_model_len"])
        root = str(self._http.base_url).rstrip("/").removesuffix("/v1")
        try:
            response = await self._http.post(f"{root}/api/show", json={"model": served_name})
        except httpx.HTTPError as exc:
            raise transport_failure(exc) from exc
        if response.status_code != 200:
            return None  # not Ollama (or not this model): the tier does not say
        try:
            show = response.json()
        except ValueError:
            return None
        return ollama_context_window(show, model=served_name) if isinstance(show, dict) else None

    async def stream_chat(
        self,
        request: ChatRequest,
        *,
        retry: Retry | None = None,
        interrupt: Interrupt | None = None,
    ) -> AsyncGenerator[Event]:
        """Events of one generation; retried transparently until the first one arrives.
        ``retry`` replaces the client's policy for this call (one attempt, when another
        upstream can take the request instead); ``interrupt`` ends a wait for the tier
        from outside (:class:`Interrupted`)."""
        retry = retry or self.retry
        deadline = time.monotonic() + self.timeouts.total
        attempt = 0
        while True:
            started = False
            try:
                async with aclosing(self._attempt(request, deadline, interrupt)) as events:
                    async for event in events:
                        started = True
                        yield event
                return
            except (InferenceUnavailable, InferenceTimeout, UpstreamRateLimited) as exc:
                attempt += 1
                if started or attempt >= retry.attempts:
                    raise
                pause = retry.delay(attempt - 1, exc.retry_after)
                if pause is None or time.monotonic() + pause >= deadline:
                    raise
                logger.info(
                    "inference attempt %d failed (%s); retrying in %.2fs", attempt, exc.code, pause
                )
                await asyncio.sleep(pause)

    def _chat_request(self, request: ChatRequest) -> httpx.Request:
        return httpx.Request(
            "POST",
            self._chat_url,
            headers=self._chat_headers,
            content=orjson.dumps(request.body()),  # compact, UTF-8 as is
            extensions=self._chat_extensions,
        )

    async def _attempt(
        self, request: ChatRequest, deadline: float, interrupt: Interrupt | None
    ) -> AsyncGenerator[Event]:
        splitter = ThinkSplitter(opened=request.reasoning_opened)
        try:
            async with AsyncExitStack() as stack:
                response = await self._transport.handle_async_request(self._chat_request(request))
                stack.push_async_callback(response.aclose)
                if response.status_code != 200:
                    body = (await response.aread()).decode("utf-8", "replace")
                    raise upstream_error(response.status_code, body, response.headers)
                reads = cast(AsyncGenerator[bytes], response.aiter_bytes())  # it is one
                stack.push_async_callback(reads.aclose)
                lines = LineSplitter()
                first = True
                done = False
                last_read = 0.0
                while not done:
                    if (
                        not first
                        and (hold := last_read + self.read_interval - time.monotonic()) > 0
                    ):
                        await asyncio.sleep(hold)  # let the tokens coming meanwhile join
                    limit = self.timeouts.first_token if first else self.timeouts.idle
                    limit = min(limit, deadline - time.monotonic())
                    try:
                        async with asyncio.timeout(max(limit, 0)) as timer:
                            read = await _read(reads, timer, interrupt)
                    except StopAsyncIteration:
                        read = None
                    except TimeoutError:
                        if interrupt is not None and interrupt.requested:
                            raise Interrupted("the stream was stopped") from None
                        what = "first token" if first else "next token"
                        raise InferenceTimeout(f"no {what} within {limit:.1f}s") from None
                    last_read = time.monotonic()
                    events: list[Event] = []
                    failure: InferenceError | None = None
                    try:
                        done = _parse(
                            lines.feed(read) if read is not None else lines.close(),
                            splitter,
                            into=events,
                        )
                    except InferenceError as exc:  # what came before it still goes out
                        failure = exc
                    for event in coalesced(events):
                        first = False
                        yield event
                    if failure is not None:
                        raise failure
                    if read is None:
                        break
                if not done:
                    raise UpstreamProtocolError("the stream ended without [DONE]")
                await _drain(reads)
                for kind, text in splitter.flush():
                    yield ReasoningDelta(text) if kind == "reasoning" else TextDelta(text)
        except httpx.HTTPError as exc:
            raise transport_failure(exc) from exc


class Interrupt:
    """Stops a stream's wait for the tier from outside it, at once: a cancel asked while
    the tier prefills or stalls would otherwise wait for the next token. Calling it ends
    the read under way (the stream raises :class:`Interrupted`), or the next one."""

    __slots__ = ("_timer", "requested")

    def __init__(self) -> None:
        self.requested = False
        self._timer: asyncio.Timeout | None = None

    def __call__(self) -> None:
        self.requested = True
        timer = self._timer
        if timer is not None and not timer.expired():  # the read's own timeout, now
            timer.reschedule(asyncio.get_running_loop().time())


async def _read(
    reads: AsyncIterator[bytes], timer: asyncio.Timeout, interrupt: Interrupt | None
) -> bytes:
    if interrupt is None:
        return await anext(reads)
    if interrupt.requested:
        raise Interrupted("the stream was stopped")
    interrupt._timer = timer
    try:
        return await anext(reads)
    finally:
        interrupt._timer = None


MAX_LINE_BYTES = 8 * 1024 * 1024  # a 2 MB token passes; a 10 MB line is refused

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


async def _drain(reads: AsyncIterator[bytes], seconds: float = 1.0) -> None:
    """Read what follows ``[DONE]`` (normally only the body's end), so that the connection
    goes back to the pool for the next answer; one that does not end soon is closed."""
    with suppress(TimeoutError, httpx.HTTPError):
        async with asyncio.timeout(seconds):
            async for _ in reads:
                pass


class LineSplitter:
    """The lines of an event stream, fed as the bytes arrive; split on LF only (a CR before
    it is dropped).

    ``str.splitlines``, and so httpx's ``aiter_lines``, also ends a line at U+2028, U+2029,
    U+0085 and other separators that a tier's JSON carries unescaped inside a string: a
    token holding one would cut its chunk in two. LF never occurs inside a multi-byte UTF-8
    sequence, so bytes are split first and each whole line decoded once.
    """

    __slots__ = ("_pending", "_size")

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[str]:
        """The lines ``chunk`` completes."""
        *complete, rest = chunk.split(b"\n")
        lines: list[str] = []
        for part in complete:
            if self._pending:
                self._pending.append(part)
                part = b"".join(self._pending)
                self._pending.clear()
                self._size = 0
            lines.append(part.removesuffix(b"\r").decode("utf-8", "replace"))
        if rest:
            self._pending.append(rest)
            self._size += len(rest)
            if self._size > MAX_LINE_BYTES:
                raise UpstreamProtocolError(f"a stream line is over {MAX_LINE_BYTES} bytes")
        return lines

    def close(self) -> list[str]:
        """The last line, when the stream ended without a newline."""
        if not self._pending:
            return []
        line, self._pending = b"".join(self._pending), []
        return [line.removesuffix(b"\r").decode("utf-8", "replace")]


def coalesced(events: list[Event]) -> list[Event]:
    """``events`` with each run of adjacent text (or reasoning) deltas merged into one.

    Everything that arrived in one read goes on as one delta: when tokens come faster than
    this process handles them one by one, each later step (journal, framing, the write)
    runs once per read instead of once per token. Nothing waits for a batch to fill, so a
    slow stream still goes token by token."""
    merged: list[Event] = []
    for kind, run in itertools.groupby(events, type):
        if kind is TextDelta or kind is ReasoningDelta:
            deltas = cast(list[TextDelta | ReasoningDelta], list(run))
            joined = len(deltas) > 1
            merged.append(kind("".join(d.text for d in deltas)) if joined else deltas[0])
        else:
            merged.extend(run)
    return merged


def _parse(lines: list[str], splitter: ThinkSplitter, *, into: list[Event]) -> bool:
    """The events of ``lines`` appended to ``into``; True once ``[DONE]`` is read."""
    for line in lines:
        payload = _data(line)
        if payload == "[DONE]":
            return True
        if payload is not None:
            into.extend(_events(_json(payload), splitter))
    return False


def _data(line: str) -> str | None:
    if not line.startswith("data:"):
        return None  # blank separators, comments, event names
    return line[5:].strip()


def _json(payload: str) -> dict[str, Any]:
    # orjson: a token's chunk parsed in under half of ``json``'s time; strict as the JSON
    # spec is (no NaN, no trailing data, no lone surrogate).
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        # Its size, never its text: the line may hold the answer (or the prompt echoed).
        size = len(payload.encode("utf-8", "replace"))
        raise UpstreamProtocolError(f"malformed JSON in the stream (a {size}-byte line)") from exc
    if not isinstance(value, dict):
        raise UpstreamProtocolError("a stream chunk is not a JSON object")
    return value


def _events(chunk: dict[str, Any], splitter: ThinkSplitter) -> list[Event]:
    if "error" in chunk:  # vLLM: an error after the stream started (the HTTP status was 200)
        raise upstream_error(None, json.dumps(chunk), {})
    events: list[Event] = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            events.append(ReasoningDelta(str(reasoning)))
        content = delta.get("content")
        if content:
            for kind, text in splitter.feed(str(content)):
                events.append(ReasoningDelta(text) if kind == "reasoning" else TextDelta(text))
        if choice.get("finish_reason"):
            events.extend(
                ReasoningDelta(text) if kind == "reasoning" else TextDelta(text)
                for kind, text in splitter.flush()
            )
            reason = str(choice["finish_reason"])
            events.append(Finished(FINISH_REASONS.get(reason, reason)))
    usage = usage_from(chunk.get("usage"))
    if usage is not None:
        events.append(usage)
    return events


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
