"""A fake OpenAI-compatible inference tier on a real socket, scripted per test.

It reproduces what llama.cpp's server and vLLM really send (see ``tests/fixtures/wire``):
no usage at all when streaming (llama.cpp), a usage chunk with empty ``choices`` (vLLM),
usage riding on a chunk that has content, ``reasoning_content`` deltas, tool calls streamed
as vLLM and OpenAI stream them (id and name, then argument pieces); and faults: an
error status before the first token, a connection dropped mid-stream, a stall, malformed
JSON, a huge chunk. It records every request and when each client went away.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

PACED_BATCH = 16
"""The most tokens a late paced stream sends in one write."""


@dataclass
class Script:
    tokens: list[str] = field(default_factory=lambda: ["Hello", " world", "."])
    reasoning: list[str] = field(default_factory=list)
    delay: float = 0.0
    usage: Literal["none", "final_chunk", "on_content"] = "none"
    usage_override: dict[str, Any] | None = None
    fail_status: int | None = None
    fail_times: int = 1
    fail_code: str | int | None = None
    fail_message: str = "refused"
    retry_after: str | None = None
    drop_after: int | None = None
    stall_after: int | None = None
    malformed_after: int | None = None
    malformed_line: bytes = b"data: {not json\n\n"
    """What ``malformed_after`` sends (a line that may carry answer text, cut short)."""
    finish_reason: str = "stop"
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    """Calls made after the content tokens, each ``{"id", "name", "arguments"}``: a first
    delta with the index, id, type and name (arguments ""), then the arguments in pieces of
    ``tool_piece`` characters, as vLLM streams them (``tests/fixtures/wire``); the finish
    reason is then ``tool_calls``."""
    tool_piece: int = 4
    emit_max_tokens: bool = False
    paced: bool = False
    """Content tokens fall due on a fixed schedule, one every ``delay`` from the first, as
    a tier generating at its own rate: when this process runs late (its cores busy), the
    tokens due go out together (up to ``PACED_BATCH`` a write) instead of each being
    pushed back. Off: a sleep of ``delay`` before each token, however long the last one
    took. ``stamp`` is the moment a token is written either way."""
    stamp: bool = False
    """Each content token ends with ``@`` and the moment it was sent (``time.perf_counter``,
    the machine's monotonic clock, the same in every process), so a bench can time each
    token's trip however the app merges them."""
    prompt_tokens: int = 11
    max_model_len: int | None = None
    api_key: str | None = None
    """When set, a request without ``Authorization: Bearer <api_key>`` gets 401 (vLLM's
    ``--api-key``)."""
    prefix_cache: bool = False
    """vLLM's automatic prefix caching: a request whose messages before the last one were
    seen before, under the same ``cache_salt`` (none is a salt too), reports all but its
    last prompt token as ``cached_tokens``."""


@dataclass
class FakeUpstream:
    script: Script = field(default_factory=Script)
    requests: list[dict[str, Any]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    """The client port of each chat request: the same port twice is a reused connection."""
    disconnected_at: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)
    spans: list[tuple[float, float, int]] = field(default_factory=list)
    """Each finished stream's output: when its first token went (``time.perf_counter``),
    when ``[DONE]`` went, and its content tokens; a bench reads the tier's own rate."""
    active: int = 0
    peak: int = 0
    """Streams open at once now, and the most ever (the app's queue bounds it)."""
    base_url: str = ""
    prefixes: set[tuple[str | None, str]] = field(default_factory=set)
    """What ``Script.prefix_cache`` has cached: (cache salt, the messages before the last)."""
    on_request: Callable[[dict[str, Any]], None] | None = None
    """Called with each chat request's body as it arrives (a test moves a fake counter)."""
    _failures: int = 0

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    def _unauthorized(self, request: Request) -> Response | None:
        expected = self.script.api_key
        if expected is None or request.headers.get("authorization") == f"Bearer {expected}":
            return None
        return JSONResponse({"error": "Unauthorized"}, status_code=401)

    async def _models(self, request: Request) -> Response:
        if (refused := self._unauthorized(request)) is not None:
            return refused
        model: dict[str, Any] = {"id": "fake", "object": "model"}
        if self.script.max_model_len:
            model["max_model_len"] = self.script.max_model_len
        return JSONResponse({"object": "list", "data": [model]})

    async def _chat(self, request: Request) -> Response:
        if (refused := self._unauthorized(request)) is not None:
            return refused
        body = await request.json()
        self.requests.append(body)
        if self.on_request is not None:
            self.on_request(body)
        self.ports.append(request.client.port if request.client else 0)
        script = self.script
        if script.fail_status and self._failures < script.fail_times:
            self._failures += 1
            headers = {"retry-after": script.retry_after} if script.retry_after else {}
            error: dict[str, Any] = {"message": "busy", "type": "server_error"}
            if script.fail_code is not None:
                error = {"message": script.fail_message, "type": "invalid_request_error"}
                error["code"] = script.fail_code
            return JSONResponse(
                {"error": error},
                status_code=script.fail_status,
                headers=headers,
            )
        tokens = list(script.tokens)
        if script.emit_max_tokens:
            tokens = [f" t{i}" for i in range(int(body["max_tokens"]))]
        cached = 0
        if script.prefix_cache:
            prefix = (body.get("cache_salt"), json.dumps(body["messages"][:-1]))
            cached = script.prompt_tokens - 1 if prefix in self.prefixes else 0
            self.prefixes.add(prefix)
        top = body.get("top_logprobs") or 0
        logprobs = top if body.get("logprobs") else None
        stream = self._stream(script, tokens, cached=cached, logprobs=logprobs)
        return StreamingResponse(stream, media_type="text/event-stream")

    async def _stream(
        self, script: Script, tokens: list[str], *, cached: int = 0, logprobs: int | None = None
    ) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            if logprobs is not None and delta.get("content"):
                choice["logprobs"] = {"content": [_logprob(delta["content"], logprobs)]}
            payload = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": "fake",
                "choices": [choice],
                **extra,
            }
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        def stamped(texts: list[str]) -> bytes:
            """The chunks of ``texts``, each stamped now (see ``Script.stamp``)."""
            sent = f"@{time.perf_counter():.6f}" if script.stamp else ""
            return b"".join(chunk({"content": text + sent}) for text in texts)

        calls = _tool_call_deltas(script)
        generated = len(tokens) + len(script.reasoning) + len(calls)
        usage = script.usage_override or {
            "prompt_tokens": script.prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": script.prompt_tokens + generated,
            "completion_tokens_details": {"reasoning_tokens": len(script.reasoning)},
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            yield chunk({"role": "assistant", "content": ""})
            started = time.perf_counter()
            for text in script.reasoning:
                await asyncio.sleep(script.delay)
                yield chunk({"reasoning_content": text})
            due, late = time.monotonic(), []  # paced: the tokens due, not sent yet
            for number, text in enumerate(tokens):
                if number == script.drop_after:
                    raise ConnectionResetError("fake upstream drops the connection")
                if number == script.stall_after:
                    await asyncio.sleep(3600)
                if number == script.malformed_after:
                    yield script.malformed_line
                if not (script.paced and script.delay > 0):
                    await asyncio.sleep(script.delay)
                    yield stamped([text])
                    continue
                due += script.delay
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                late.append(text)
                # Sent once the next token is not due yet, or 16 are waiting (a late fake
                # still sends as it goes, just fewer, bigger writes).
                if due + script.delay > time.monotonic() or len(late) == PACED_BATCH:
                    yield stamped(late)
                    late.clear()
            if late:
                yield stamped(late)
            for call in calls:
                await asyncio.sleep(script.delay)
                yield chunk({"tool_calls": [call]})
            extra = {"usage": usage} if script.usage == "on_content" else {}
            finish = "tool_calls" if calls else script.finish_reason
            yield chunk({}, finish=finish, **extra)
            if script.usage == "final_chunk":
                payload = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "model": "fake",
                    "choices": [],
                    "usage": usage,
                }
                yield b"data: " + json.dumps(payload).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            self.finished_at.append(time.monotonic())
            self.spans.append((started, time.perf_counter(), len(tokens)))
        except asyncio.CancelledError:
            self.disconnected_at.append(time.monotonic())
            raise
        finally:
            self.active -= 1


def _logprob(token: str, top: int) -> dict[str, Any]:
    """A token's entry as vLLM writes it: the token's own log probability (-0.25 for
    every token) and ``top`` alternatives, the token itself first."""
    alternatives = [(token, -0.25), *((f"alt{i}", -2.0 - i) for i in range(1, top))]
    return {
        "token": token,
        "logprob": -0.25,
        "bytes": list(token.encode()),
        "top_logprobs": [
            {"token": text, "logprob": value, "bytes": list(text.encode())}
            for text, value in alternatives[:top]
        ],
    }


def _tool_call_deltas(script: Script) -> list[dict[str, Any]]:
    """The ``delta.tool_calls`` items of ``script.tool_calls``, one per chunk."""
    deltas: list[dict[str, Any]] = []
    for index, call in enumerate(script.tool_calls):
        deltas.append(
            {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": ""},
            }
        )
        arguments, size = call["arguments"], max(1, script.tool_piece)
        for start in range(0, len(arguments), size):
            piece = arguments[start : start + size]
            deltas.append({"index": index, "function": {"arguments": piece}})
    return deltas


class ServerThread:
    """Any ASGI app served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextmanager
def fake_upstream() -> Iterator[FakeUpstream]:
    upstream = FakeUpstream()
    with ServerThread(upstream.app()) as url:
        upstream.base_url = f"{url}/v1"
        yield upstream
