"""An async client for OpenAI-compatible inference servers (llama.cpp, vLLM, Ollama, TGI).

Always streams, with ``stream_options.include_usage``, and turns the wire into typed
events. Split timeouts: connect, first token, idle between chunks, and total. Retries
with exponential backoff and full jitter (honouring ``Retry-After``) happen only before
the first event has been handed to the caller; after that a failure is final, so no text
is ever duplicated. Every ``httpx`` error is wrapped in :mod:`inference.errors`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from typing import Any

import httpx

from inference.errors import (
    ContextLengthExceeded,
    InferenceError,
    InferenceTimeout,
    InferenceUnavailable,
    UpstreamProtocolError,
)
from inference.reasoning import ThinkSplitter
from inference.tokenizers import ChatMessage

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


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

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_delay)
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))  # noqa: S311


@dataclass(slots=True)
class ChatRequest:
    model: str
    messages: Sequence[ChatMessage]
    max_tokens: int
    temperature: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

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
    ) -> None:
        self.timeouts = timeouts or Timeouts()
        self.retry = retry or Retry()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/",
            headers=headers,
            transport=transport,
            verify=_ssl_context(),
            # Shared by every answer of a process: the app's queue bounds what reaches the
            # tier, not the pool; idle connections are kept for the next answers.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            timeout=httpx.Timeout(
                connect=self.timeouts.connect,
                read=self.timeouts.idle,
                write=self.timeouts.connect,
                pool=self.timeouts.connect,
            ),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def models(self) -> list[dict[str, Any]]:
        try:
            response = await self._http.get("models")
        except httpx.HTTPError as exc:
            raise InferenceUnavailable(f"inference tier unreachable: {exc!r}") from exc
        if response.status_code != 200:
            raise _status_error(response.status_code, response.text, response.headers)
        data = response.json().get("data", [])
        return [item for item in data if isinstance(item, dict)]

    async def stream_chat(self, request: ChatRequest) -> AsyncIterator[Event]:
        """Events of one generation; retried transparently until the first one arrives."""
        deadline = time.monotonic() + self.timeouts.total
        attempt = 0
        while True:
            started = False
            try:
                async with aclosing(self._attempt(request, deadline)) as events:
                    async for event in events:
                        started = True
                        yield event
                return
            except (InferenceUnavailable, InferenceTimeout) as exc:
                attempt += 1
                if started or attempt >= self.retry.attempts:
                    raise
                pause = self.retry.delay(attempt - 1, exc.retry_after)
                if time.monotonic() + pause >= deadline:
                    raise
                logger.info(
                    "inference attempt %d failed (%s); retrying in %.2fs", attempt, exc.code, pause
                )
                await asyncio.sleep(pause)

    async def _attempt(self, request: ChatRequest, deadline: float) -> AsyncGenerator[Event]:
        splitter = ThinkSplitter()
        try:
            async with self._http.stream(
                "POST", "chat/completions", json=request.body()
            ) as response:
                if response.status_code != 200:
                    body = (await response.aread()).decode("utf-8", "replace")
                    raise _status_error(response.status_code, body, response.headers)
                lines = _sse_lines(response.aiter_bytes())
                first = True
                done = False
                while not done:
                    limit = self.timeouts.first_token if first else self.timeouts.idle
                    limit = min(limit, deadline - time.monotonic())
                    try:
                        async with asyncio.timeout(max(limit, 0)):
                            line = await anext(lines)
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        what = "first token" if first else "next token"
                        raise InferenceTimeout(f"no {what} within {limit:.1f}s") from None
                    payload = _data(line)
                    if payload is None:
                        continue
                    if payload == "[DONE]":
                        done = True
                        continue
                    for event in _events(_json(payload), splitter):
                        first = False
                        yield event
                if not done:
                    raise UpstreamProtocolError("the stream ended without [DONE]")
                await _drain(lines)
                for kind, text in splitter.flush():
                    yield ReasoningDelta(text) if kind == "reasoning" else TextDelta(text)
        except httpx.TimeoutException as exc:
            raise InferenceTimeout(f"inference tier timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise InferenceUnavailable(f"inference tier connection failed: {exc!r}") from exc


MAX_LINE_BYTES = 8 * 1024 * 1024  # a 2 MB token passes; a 10 MB line is refused


async def _drain(lines: AsyncIterator[str], seconds: float = 1.0) -> None:
    """Read what follows ``[DONE]`` (normally only the body's end), so that the connection
    goes back to the pool for the next answer; one that does not end soon is closed."""
    with suppress(TimeoutError, httpx.HTTPError):
        async with asyncio.timeout(seconds):
            async for _ in lines:
                pass


async def _sse_lines(chunks: AsyncIterator[bytes]) -> AsyncGenerator[str]:
    """The lines of an event stream, split on LF only (a CR before it is dropped).

    ``str.splitlines``, and so httpx's ``aiter_lines``, also ends a line at U+2028, U+2029,
    U+0085 and other separators that a tier's JSON carries unescaped inside a string: a
    token holding one would cut its chunk in two. LF never occurs inside a multi-byte UTF-8
    sequence, so bytes are split first and each whole line decoded once.
    """
    pending: list[bytes] = []
    size = 0
    async for chunk in chunks:
        *complete, rest = chunk.split(b"\n")
        for part in complete:
            pending.append(part)
            line = b"".join(pending)
            pending.clear()
            size = 0
            yield line.removesuffix(b"\r").decode("utf-8", "replace")
        if rest:
            pending.append(rest)
            size += len(rest)
            if size > MAX_LINE_BYTES:
                raise UpstreamProtocolError(f"a stream line is over {MAX_LINE_BYTES} bytes")
    if pending:
        yield b"".join(pending).removesuffix(b"\r").decode("utf-8", "replace")


def _data(line: str) -> str | None:
    if not line.startswith("data:"):
        return None  # blank separators, comments, event names
    return line[5:].strip()


def _json(payload: str) -> dict[str, Any]:
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise UpstreamProtocolError(f"malformed JSON in the stream: {payload[:200]!r}") from exc
    if not isinstance(value, dict):
        raise UpstreamProtocolError("a stream chunk is not a JSON object")
    return value


def _events(chunk: dict[str, Any], splitter: ThinkSplitter) -> list[Event]:
    if "error" in chunk:  # vLLM: an error after the stream started
        error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": chunk["error"]}
        raise InferenceError(
            str(error.get("message", "upstream error")),
            code=str(error.get("code") or "inference_error"),
        )
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
            events.append(Finished(str(choice["finish_reason"])))
    usage = chunk.get("usage")
    if isinstance(usage, dict) and "prompt_tokens" in usage:
        prompt_details = usage.get("prompt_tokens_details") or {}
        completion_details = usage.get("completion_tokens_details") or {}
        reasoning_tokens = completion_details.get("reasoning_tokens")
        events.append(
            UpstreamUsage(
                prompt_tokens=int(usage["prompt_tokens"]),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                cached_tokens=int(prompt_details.get("cached_tokens") or 0),
                reasoning_tokens=int(reasoning_tokens) if reasoning_tokens is not None else None,
            )
        )
    return events


def _status_error(status: int, body: str, headers: Mapping[str, str]) -> InferenceError:
    message, code = body[:500], None
    try:
        error = json.loads(body).get("error")
        if isinstance(error, dict):
            message, code = str(error.get("message", message)), error.get("code")
        elif isinstance(error, str):
            message = error
    except (json.JSONDecodeError, AttributeError):
        pass
    if code == "context_length_exceeded":
        return ContextLengthExceeded(message)
    retry_after = _retry_after(headers.get("retry-after"))
    if status in RETRYABLE_STATUS:
        return InferenceUnavailable(
            f"inference tier answered {status}: {message}", retry_after=retry_after
        )
    return InferenceError(
        f"inference tier answered {status}: {message}",
        code=str(code) if code else "inference_error",
    )


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
