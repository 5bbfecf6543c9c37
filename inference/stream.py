"""Reading one event stream: its lines as the bytes arrive, the typed events they hold,
each read's deltas merged, and the :class:`Interrupt` that ends a wait for the tier."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import suppress
from typing import Any, cast

import httpx
import orjson

from inference.chat import (
    Event,
    Finished,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
)
from inference.dialects import FINISH_REASONS, upstream_error, usage_from
from inference.errors import Interrupted, UpstreamProtocolError
from inference.reasoning import ThinkSplitter

MAX_LINE_BYTES = 8 * 1024 * 1024  # a 2 MB token passes; a 10 MB line is refused


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


async def read_once(
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


async def drain(reads: AsyncIterator[bytes], seconds: float = 1.0) -> None:
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
        if kind is TextDelta:
            texts = cast(list[TextDelta], list(run))
            logprobs = tuple(entry for delta in texts for entry in delta.logprobs)
            text = "".join(d.text for d in texts)
            merged.append(TextDelta(text, logprobs) if len(texts) > 1 else texts[0])
        elif kind is ReasoningDelta:
            thoughts = cast(list[ReasoningDelta], list(run))
            thought = "".join(d.text for d in thoughts)
            merged.append(ReasoningDelta(thought) if len(thoughts) > 1 else thoughts[0])
        else:
            merged.extend(run)
    return merged


def parse_lines(lines: list[str], splitter: ThinkSplitter, *, into: list[Event]) -> bool:
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
    # orjson: faster than ``json`` on every token's chunk (docs/gateway.md); strict as the
    # JSON spec is (no NaN, no trailing data, no lone surrogate).
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
        split = splitter.feed(str(content)) if content else []
        events.extend(_content(split, token_logprobs(choice.get("logprobs"))))
        events.extend(_tool_calls(delta.get("tool_calls")))
        if choice.get("finish_reason"):
            events.extend(_content(splitter.flush(), ()))
            reason = str(choice["finish_reason"])
            events.append(Finished(FINISH_REASONS.get(reason, reason)))
    usage = usage_from(chunk.get("usage"))
    if usage is not None:
        events.append(usage)
    return events


def _content(
    split: Sequence[tuple[str, str]], logprobs: tuple[TokenLogprob, ...]
) -> list[TextDelta | ReasoningDelta]:
    """A chunk's content as the splitter cut it, its tokens' log probabilities on its last
    answer text (none on reasoning, as OpenAI's ``logprobs.content`` describes the message
    content; on an empty text when the chunk carried them without content)."""
    events: list[TextDelta | ReasoningDelta] = [
        ReasoningDelta(text) if kind == "reasoning" else TextDelta(text) for kind, text in split
    ]
    if not logprobs:
        return events
    texts = [i for i, event in enumerate(events) if isinstance(event, TextDelta)]
    if texts:
        events[texts[-1]] = TextDelta(events[texts[-1]].text, logprobs)
    elif not events:
        events.append(TextDelta("", logprobs))
    return events


def token_logprobs(raw: object) -> tuple[TokenLogprob, ...]:
    """A choice's ``logprobs.content`` as OpenAI writes each entry (``token``, ``logprob``,
    ``bytes``, ``top_logprobs``), whichever server sent it: TGI leaves out ``bytes``,
    llama.cpp's alternatives may lack them too. Entries not shaped so are left out."""
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list):
        return ()
    entries: list[TokenLogprob] = []
    for item in content:
        entry = _logprob_entry(item)
        if entry is not None:
            alternatives = item.get("top_logprobs") or []
            tops = [top for top in map(_logprob_entry, alternatives) if top is not None]
            entries.append({**entry, "top_logprobs": tops})
    return tuple(entries)


def _logprob_entry(item: object) -> dict[str, Any] | None:
    if not isinstance(item, dict) or not isinstance(item.get("token"), str):
        return None
    logprob = item.get("logprob")
    if not isinstance(logprob, (int, float)) or isinstance(logprob, bool):
        return None
    raw_bytes = item.get("bytes")
    token_bytes = raw_bytes if isinstance(raw_bytes, list) else list(item["token"].encode())
    value = float(logprob)
    value = value if math.isfinite(value) and value > -9999.0 else -9999.0  # OpenAI's floor
    return {"token": item["token"], "logprob": value, "bytes": token_bytes}


def _tool_calls(raw: object) -> list[ToolCallDelta]:
    """``delta.tool_calls`` as typed fragments. Servers differ in how they cut a call
    (vLLM and OpenAI: id and name first, then argument pieces; llama.cpp and Ollama: often
    the whole call in one delta, Ollama without an ``index``), so each piece says what it
    has; a call without an index is the next one."""
    if not isinstance(raw, list):
        return []
    found: list[ToolCallDelta] = []
    for position, call in enumerate(raw):
        if not isinstance(call, dict):
            raise UpstreamProtocolError("a tool call in the stream is not a JSON object")
        function = call.get("function") or {}
        index = call.get("index")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments)  # Ollama's native form: an object
        found.append(
            ToolCallDelta(
                index=index if isinstance(index, int) else position,
                id=str(call["id"]) if call.get("id") else None,
                name=str(function["name"]) if function.get("name") else None,
                arguments=arguments or "",
            )
        )
    return found
