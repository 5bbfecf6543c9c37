"""Answers streamed from the app and from the tier, timed at the client: one at a time,
or in batches of concurrent streams (answer_latency and gateway measure with these)."""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.harness.processes import CONTEXT_WINDOW


@dataclass
class Stream:
    sent: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    """Tokens in each chunk: the app merges the tokens that reach it in one read."""
    trips: list[tuple[float, float]] = field(default_factory=list)
    """(sent by the tier, seconds until it arrived here) for each stamped token."""
    headers: float | None = None
    """When the response's status and headers arrived (the app's: admitted, slot held)."""
    error: str | None = None

    def add(self, arrived: float, text: str) -> None:
        self.chunk_times.append(arrived)
        self.chunk_tokens.append(len(FAKE_TOKEN.findall(text)) or 1)
        self.trips += [(float(t), arrived - float(t)) for t in SENT_AT.findall(text)]

    @property
    def ttft(self) -> float:
        if not self.chunk_times:
            raise RuntimeError(f"no content arrived ({self.error or 'empty answer'})")
        return self.chunk_times[0] - self.sent

    @property
    def rate(self) -> float | None:
        """Tokens per second from the request to the last token: a stream that arrives in
        bursts (tokens merged while the app catches up) is not flattered by a short span
        between its first and last chunk."""
        times = self.chunk_times
        if not times or times[-1] <= self.sent:
            return None
        return sum(self.chunk_tokens) / (times[-1] - self.sent)


# The fake tier's tokens (" t0", " t1", ...): counted inside a merged delta. Any other text
# counts one token per chunk.
FAKE_TOKEN = re.compile(r" t\d+")
SENT_AT = re.compile(r"@(\d+\.\d+)")  # the fake's ``stamp``: when it sent the token


def stream_direct(client: httpx.Client, body: dict[str, Any]) -> Stream:
    """Stream ``body`` from the tier's /v1/chat/completions; times of content chunks."""
    result = Stream(time.perf_counter())
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            result.error = f"{response.status_code}: {response.read()[:300]!r}"
            return result
        for line in response.iter_lines():
            arrived = time.perf_counter()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            text = "".join(
                (c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or []
            )
            if text:
                result.add(arrived, text)
    return result


def stream_app(client: httpx.Client, conversation_id: int, body: dict[str, Any]) -> Stream:
    """Stream an answer from the app's native SSE endpoint; times of ``delta`` events."""
    result = Stream(time.perf_counter())
    with client.stream(
        "POST",
        f"/api/v1/conversations/{conversation_id}/messages",
        json=body,
        headers={"Accept": "text/event-stream"},
    ) as response:
        result.headers = time.perf_counter()
        if response.status_code != 200:
            result.error = f"{response.status_code}: {response.read()[:300]!r}"
            return result
        event = ""
        for line in response.iter_lines():
            arrived = time.perf_counter()
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "delta":
                result.add(arrived, json.loads(line[5:])["text"])
            elif line.startswith("data:") and event == "error":
                result.error = line[5:].strip()
            elif line == "":
                if event == "done":
                    break
                event = ""
    return result


def new_conversation(client: httpx.Client) -> int:
    response = client.post("/api/v1/conversations", json={})
    if response.status_code != 201:
        raise RuntimeError(f"creating a conversation: {response.status_code} {response.text}")
    return int(response.json()["id"])


def app_body(question: str, max_tokens: int) -> dict[str, Any]:
    # cache: false: every round must reach the tier, not replay the response cache.
    return {
        "content": question,
        "max_tokens": max_tokens,
        "top_k": 0,
        "stream": True,
        "cache": False,
    }


def direct_body(tokenizer: Any, question: str, max_tokens: int) -> dict[str, Any]:
    """The body the app sends the tier for ``question`` with retrieval off and no history."""
    from apps.chat.services.registry import model_alias_resolve
    from inference import ChatRequest, assemble_prompt

    prompt = assemble_prompt(
        tokenizer=tokenizer,
        question=question,
        context_window=CONTEXT_WINDOW,
        max_output_tokens=max_tokens,
    )
    served_name = model_alias_resolve(alias=None).model
    return ChatRequest(model=served_name, messages=prompt.messages, max_tokens=max_tokens).body()


def app_client(url: str, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=httpx.Timeout(600, connect=10),
    )


def tier_client(base_url: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, timeout=httpx.Timeout(600, connect=10))


# --------------------------------------------------------------------------- statistics


def concurrent_streams(count: int, start: Callable[[int], Stream]) -> list[Stream]:
    """``start(i)`` for i in range(count) in threads released together."""
    barrier = threading.Barrier(count)
    results: list[Stream | None] = [None] * count
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=60)
            results[index] = start(index)
        except BaseException as exc:  # reported below, in the caller's thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=900)
    if failures:
        raise RuntimeError(f"a stream failed: {failures[0]!r}") from failures[0]
    streams = [r for r in results if r is not None]
    errors = [s.error for s in streams if s.error]
    if errors or len(streams) != count:
        raise RuntimeError(f"stream errors: {errors or 'threads did not finish'}")
    return streams


@dataclass
class BatchStats:
    per_stream: list[float] = field(default_factory=list)
    aggregate: list[float] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    wait_ms: list[float] = field(default_factory=list)
    headers_ms: list[float] = field(default_factory=list)
    source: list[float] = field(default_factory=list)
    """The tier's own output rate per stream, timed at the fake (its spans): tokens / (its
    ``[DONE]`` - its first token), one figure per stream."""
    cpu_ms: dict[str, list[float]] = field(default_factory=dict)
    """CPU time per answer of each process measured (see ``measure_throughput``'s
    ``cpu``), one figure per batch."""

    def add_cpu(self, before: dict[str, float], after: dict[str, float], answers: int) -> None:
        for name, seconds in after.items():
            per_answer = (seconds - before[name]) * 1000.0 / answers
            self.cpu_ms.setdefault(name, []).append(per_answer)

    def add_spans(self, spans: list[tuple[float, float, int]]) -> None:
        self.source.extend(tokens / (end - start) for start, end, tokens in spans if end > start)

    def add(self, streams: list[Stream]) -> None:
        for stream in streams:
            if stream.headers is not None:
                self.headers_ms.append((stream.headers - stream.sent) * 1000.0)
            rate = stream.rate
            if rate is not None:
                self.per_stream.append(rate)
            self.chunks.append(len(stream.chunk_times))
            self.wait_ms.append(stream.ttft * 1000.0)
        done = [stream for stream in streams if stream.chunk_times]
        if done:
            tokens = sum(sum(stream.chunk_tokens) for stream in done)
            span = max(s.chunk_times[-1] for s in done) - min(s.sent for s in streams)
            self.aggregate.append(tokens / span)


def measure_throughput(
    *,
    app: httpx.Client,
    tier: httpx.Client,
    body_direct: dict[str, Any],
    question: str,
    max_tokens: int,
    concurrency: Sequence[int],
    reps: int,
    spans: Callable[[], list[tuple[float, float, int]]] | None = None,
    cpu: Callable[[], dict[str, float]] | None = None,
) -> dict[tuple[str, int], BatchStats]:
    """Batches of concurrent streams, app and tier alternating; stats by (kind, count).
    ``spans``: the fake tier's record of the streams it served since the last call.
    ``cpu``: CPU seconds used so far by each process of interest, by name, read before
    and after each batch's streams (the conversations are made before)."""
    stats: dict[tuple[str, int], BatchStats] = {}
    warm = stream_direct(tier, body_direct)  # warm-up
    if warm.error:
        raise RuntimeError(f"tier: {warm.error}")
    if spans is not None:
        spans()  # not the warm-up's
    for count in concurrency:
        stats[("app", count)], stats[("tier", count)] = BatchStats(), BatchStats()
        for rep in range(reps):
            for kind in ("app", "tier") if rep % 2 == 0 else ("tier", "app"):
                calls: list[Callable[[], Stream]]
                if kind == "app":  # the conversations are made before the clock starts
                    body = app_body(question, max_tokens)
                    conversations = [new_conversation(app) for _ in range(count)]
                    calls = [functools.partial(stream_app, app, c, body) for c in conversations]
                else:
                    calls = [functools.partial(stream_direct, tier, body_direct)] * count
                before = cpu() if cpu is not None else {}
                streams = concurrent_streams(count, lambda i, calls=calls: calls[i]())
                stats[(kind, count)].add(streams)
                if cpu is not None:
                    stats[(kind, count)].add_cpu(before, cpu(), count)
                if spans is not None:
                    stats[(kind, count)].add_spans(spans())
    return stats
