"""An async client for OpenAI-compatible inference servers (llama.cpp, vLLM, Ollama, TGI,
Triton's OpenAI frontend).

Always streams, with ``stream_options.include_usage``, and turns the wire into typed
events (:mod:`inference.stream` reads it). Split timeouts: connect, first token, idle
between chunks, and total. Retries with exponential backoff and full jitter (honouring
``Retry-After``) happen only before the first event has been handed to the caller; after
that a failure is final, so no text is ever duplicated. Every ``httpx`` error is wrapped
in :mod:`inference.errors`, and every server's dialect is read in
:mod:`inference.dialects`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import ssl
import time
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass
from typing import Any, cast

import httpx
import orjson

from inference.chat import ChatRequest, Event, ReasoningDelta, TextDelta
from inference.dialects import (
    ollama_context_window,
    sampling_wire,
    transport_failure,
    upstream_error,
)
from inference.errors import (
    InferenceError,
    InferenceTimeout,
    InferenceUnavailable,
    Interrupted,
    UpstreamProtocolError,
    UpstreamRateLimited,
)
from inference.reasoning import ThinkSplitter
from inference.stream import Interrupt, LineSplitter, coalesced, drain, parse_lines, read_once
from inference.transport import READ_ON_DEMAND, AiohttpTransport

logger = logging.getLogger(__name__)


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


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """Built once: loading the CA bundle is slow, on the event loop, per client (see
    docs/gateway.md)."""
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
        # cost time before the first token for nothing a chat stream uses; docs/gateway.md).
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
        body = request.body()
        body.update(sampling_wire(request.server, request.sampling))
        return httpx.Request(
            "POST",
            self._chat_url,
            headers=self._chat_headers,
            content=orjson.dumps(body),  # compact, UTF-8 as is
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
                            read = await read_once(reads, timer, interrupt)
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
                        done = parse_lines(
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
                await drain(reads)
                for kind, text in splitter.flush():
                    yield ReasoningDelta(text) if kind == "reasoning" else TextDelta(text)
        except httpx.HTTPError as exc:
            raise transport_failure(exc) from exc
