"""The gateway hot path against its targets, embedded default and PostgreSQL + Redis side by side.

What is measured (every part in both configurations; one line per target,
"target | measured | met?" for each configuration; nothing is asserted)
    1. Added time to first token. A fake OpenAI-compatible tier (``tests.fake_upstream`` in
       its own process) with zero prefill: the first token goes out at once. One request at
       a time, ``--rounds`` rounds (after ``--warmup``), app and tier interleaved with the
       order alternating each round. TTFT = send -> first content token at the client: the
       first ``event: delta`` from the native SSE endpoint
       ``POST /api/v1/conversations/<id>/messages`` (``Accept: text/event-stream``,
       ``top_k: 0``, so no retrieval; the conversation is created before the clock starts),
       the first chunk with non-empty ``delta.content`` from the OpenAI-compatible
       ``POST /v1/chat/completions`` (``stream: true``, ``rag: {"enabled": false}``) and
       from the tier's own ``/v1/chat/completions`` (the body the app sends, built as
       ``bench.harness.direct_body`` builds it). Each surface has its own tier sample per round.
       Reported per surface: p50 and p99 of the per-round difference app - tier.
       Targets: p50 <= 3 ms, p99 <= 15 ms. Beside them, what one answer costs the app's
       process: its CPU (all threads, ``/proc/<pid>/task/*/schedstat``) over
       ``--cpu-answers`` (100) answers one after another, per surface. The native surface
       stores each answer (two messages, the event journal), the OpenAI surface by default
       does not.
    2. Admission: ``budget_reserve`` + ``budget_settle`` in this process, measured by
       ``bench.harness.run_configuration``, as bench/admission_latency.py measures it (one
       sample = reserve + settle; the reserve alone, the step before the first token, is
       shown beside),
       ``--admission-concurrency`` (32) threads at once spread over 8 teams, then all on one
       team. Every team has a ``Limit`` (token bucket, daily quota, stream slots), so each
       limiter path runs and nothing is refused. The limiter store is the database (SQLite)
       in the embedded configuration and Redis in the other.
       Targets: 8 teams p50 <= 2 ms, p99 <= 20 ms; one team p99 <= 50 ms.
    3. Tokens/s at the client against the tier: the fake at 1 ms per token, ``--tokens``
       (500) per answer, 4 and 32 streams at once (threads, ``bench.harness``'s
       ``measure_throughput``), ``--reps`` batches each, app and tier alternating.
       Aggregate rate of a batch = tokens / (last chunk of any stream - first request sent),
       tokens counted inside the app's merged deltas (see ``bench.harness.Stream``);
       reported: median over batches, ratio app/tier.
       Targets: >= 0.97x at 4 streams, >= 0.95x at 32.
       The fake paces its tokens on a fixed schedule (``Script.paced``: token i due i ms
       after the first, those due sent together when it runs late), as a tier generating
       at its own rate: paced by a sleep per token instead, it ran at 790-840 tokens/s per
       stream, slower still beside the app (both share the machine's cores), so the
       ratio weighed the fake's share of the CPU. Beside it, the fake's own rate per
       stream in the same batches (its spans: tokens / (``[DONE]`` - first token), timed
       at the fake, median), serving the app and serving the client directly. And the
       CPU each process spent per answer in the same batches (all its threads, from
       ``/proc/<pid>/task/*/schedstat``; this client: ``time.process_time``): the app's is
       what the two sides' difference costs, on cores it shares with the fake and the
       client.
    4. ``--streams`` (1,000) native SSE streams at once into one uvicorn worker, opened
       together from one ``httpx.AsyncClient``, against a slow fake tier (one token a
       second, ``--slow-tokens`` (60) per answer), and the same streams straight to the
       fake first. The fake stamps each token with the moment it sent it (its ``stamp``
       script; the monotonic clock is one clock for every process of the machine), so
       each token's trip, tier -> client, is timed however the app merges tokens. Trips are
       split at the moment every stream has its first token: before (the ramp, while the
       rest are still being opened) and after (all open, until the first stream ends).
       Added token delay = p99 of the trips via the app - p99 of the trips straight to the
       fake, all open (target <= 10 ms; the figures beside it say what the client and the
       fake add by themselves, and what opening costs the streams already open). The
       inter-chunk gap (the old figure: gap between consecutive ``delta`` events - 1.0 s)
       is shown too. Memory per stream = (peak VmRSS of the uvicorn process while the
       streams run - VmRSS just before) / streams, from /proc/<pid>/status. PostgreSQL
       connections = peak count of ``pg_stat_activity`` rows for the bench database,
       sampled every 0.2 s from a connection to another database while the streams run
       (target under 20; n/a on SQLite).

How
    One child process per configuration (this script again, with ``--child``), each with a
    fresh temp ``RAGTIER_DATA_DIR``. Embedded: ``DATABASE_URL`` and ``REDIS_URL`` dropped
    (a new SQLite file). PostgreSQL + Redis: ``--database-url`` (default database
    ``ragtier_bench``, created fresh with Django's test-database machinery and dropped at the
    end) and ``--redis-url`` (default db 14) with unique key prefixes (rate limits, queue
    slots); those keys and the answers' event buffers are deleted at the end. Django runs in the
    child (``config.settings.base``) to migrate, create a team and an API key
    (``bench.harness.setup_data``, no corpus) and for part 2. Subprocesses on
    loopback ports: the fake tier and the app (``uvicorn config.asgi:application``, one
    worker, started by the harness's ``start_app`` with ``INFERENCE_BASE_URL`` at the
    fake, ``INFERENCE_MAX_CONCURRENCY=2000``, ``INFERENCE_QUEUE_TIMEOUT=30``); the app
    counts with its default tokenizer (the real GGUF one), as answer_latency's fake part
    does. The open-file limit is raised to its hard limit first (the subprocesses inherit
    it). The client and the fake collect garbage as the app's web process does
    (``quiet_gc``: startup heap frozen, young generation every 10,000 allocations), so
    that their own pauses are not counted as the app's. Wall clock: ``time.perf_counter``
    at the client. On a machine with few cores the fake, the app, the databases and this
    client share them: the load average at the start of each part is printed per
    configuration. The parent prints the table at the end.

Run
    .venv/bin/python bench/gateway.py
    .venv/bin/python bench/gateway.py --rounds 20 --streams 100 --config embedded
    .venv/bin/python bench/gateway.py --only 4 --config postgres
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import operator
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/gateway.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    FAKE_UPSTREAM_CODE,
    Service,
    Services,
    Stream,
    app_body,
    app_client,
    check_postgres,
    check_redis,
    cpu_seconds,
    direct_body,
    free_port,
    fresh_database,
    measure_throughput,
    median,
    new_conversation,
    percentile,
    quiet_gc,
    redis_cleanup,
    run_configuration,
    service_env,
    setup_data,
    start_app,
    start_django,
    stream_app,
    stream_direct,
    tier_client,
    wait_ready,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/ragtier_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"
CONFIGS = {"embedded": "embedded (SQLite, no Redis)", "postgres": "PostgreSQL + Redis"}
PARTS = {
    "1": "Added time to first token, app - tier directly (fake tier, zero prefill, one at a time)",
    "2": "Admission: budget_reserve + budget_settle, concurrent threads",
    "3": "Tokens/s at the client, app / tier (fake tier, 1 ms per token)",
    "4": "Open SSE streams in one uvicorn worker (slow fake tier, 1 token/s)",
}
QUESTION = "How are API keys stored?"
STREAM_QUESTION = "Write a long, detailed story about a lighthouse keeper and a storm."
APP_ENV = {"INFERENCE_MAX_CONCURRENCY": "2000", "INFERENCE_QUEUE_TIMEOUT": "30"}
COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
}


# --------------------------------------------------------------------------- report


def load_now() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} {five:.2f}"


@dataclass
class Part:
    """One part's results in one configuration, as the parent prints them."""

    load: str = field(default_factory=load_now)
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def add(
        self,
        name: str,
        value: float | None,
        unit: str,
        target: tuple[str, float] | None = None,
        digits: int = 2,
    ) -> None:
        """A row; ``target`` = (operator, bound), e.g. ("<=", 3.0); None: reported only."""
        text = "n/a" if value is None else f"{value:.{digits}f}{unit}"
        met = None if value is None or target is None else COMPARE[target[0]](value, target[1])
        goal = f"{target[0]} {target[1]:g}{unit}" if target else ""
        self.rows.append({"name": name, "goal": goal, "text": text, "met": met})


def run_part(parts: dict[str, Part], number: str, measure: Callable[[Part], None]) -> None:
    part = parts[number] = Part()
    print(f"  part {number} (load {part.load})", flush=True)
    try:
        measure(part)
    except Exception as exc:  # the other parts still run; the table shows the error
        traceback.print_exc()
        part.error = f"{type(exc).__name__}: {exc}"[:300]


def print_report(results: dict[str, dict[str, Any]], configs: list[str]) -> None:
    for number, title in PARTS.items():
        present = [c for c in configs if number in results.get(c, {}).get("parts", {})]
        if not present:
            continue
        parts = {c: results[c]["parts"][number] for c in present}
        print()
        print(f"== {number}. {title}")
        loads = "; ".join(f"{c} {parts[c]['load']}" for c in present)
        print(f"load average (1 min, 5 min) at the start, on {os.cpu_count()} cpus: {loads}")
        names: dict[str, str] = {}
        for config in present:
            for row in parts[config]["rows"]:
                names.setdefault(row["name"], row["goal"])
        labels = {name: f"{name} {goal}".rstrip() for name, goal in names.items()}
        width = max([len("target"), *map(len, labels.values())])
        column = max(len(CONFIGS[c]) for c in present)
        print(
            f"{'target':<{width}} | "
            + " | ".join(f"{CONFIGS[c]:>{column}} | met?" for c in present)
        )
        print("-" * (width + len(present) * (column + 10)))
        for name, label in labels.items():
            cells = []
            for config in present:
                row = next((r for r in parts[config]["rows"] if r["name"] == name), None)
                text = row["text"] if row else ("error" if parts[config]["error"] else "-")
                met = row["met"] if row else None
                verdict = "-" if met is None else ("yes" if met else "NO")
                cells.append(f"{text:>{column}} | {verdict:<4}")
            print(f"{label:<{width}} | " + " | ".join(cells))
        for config in present:
            for note in parts[config]["notes"]:
                print(f"  {config}: {note}")
            if parts[config]["error"]:
                print(f"  {config}: ERROR {parts[config]['error']}")


# --------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    args: argparse.Namespace
    config: str
    key: str
    tokenizer: Any
    app_service: Service
    tier_service: Service
    app_url: str
    tier_url: str
    app: httpx.Client
    tier: httpx.Client

    def set_delay(self, seconds: float, *, stamp: bool = False, paced: bool = False) -> None:
        """The fake's pause before each token; ``stamp``: tokens carry their send time;
        ``paced``: on a fixed schedule (``Script.paced``)."""
        params = {"seconds": seconds, "stamp": int(stamp), "paced": int(paced)}
        self.tier.post("/bench/delay", params=params).raise_for_status()

    def tier_spans(self) -> list[tuple[float, float, int]]:
        """The streams the fake finished since the last call (see ``FakeUpstream.spans``)."""
        response = self.tier.get("/bench/spans")
        response.raise_for_status()
        return [(start, end, tokens) for start, end, tokens in response.json()]


def raise_fd_limit() -> int:
    """Soft open-file limit up to the hard one (subprocesses inherit it); the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    return int(soft)


def config_env(args: argparse.Namespace, config: str, prefix: str) -> dict[str, str]:
    """What the app and this process need on top of ``service_env`` for ``config``."""
    if config == "embedded":
        return {}
    return {
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "RATE_LIMIT_KEY_PREFIX": f"{prefix}limits:",
        "INFERENCE_QUEUE_KEY_PREFIX": f"{prefix}queue:",
    }


def delete_event_buffers(redis_url: str) -> int:
    """The Redis event buffers of this run's answers (their keys have no prefix setting)."""
    import redis

    from apps.chat.event_store import RedisEventStore
    from apps.chat.models import Message

    ids = list(Message.objects.values_list("id", flat=True))
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=5)
    for start in range(0, len(ids), 500):
        client.delete(*(RedisEventStore.key(i) for i in ids[start : start + 500]))
    return len(ids)


# --------------------------------------------------------------------------- part 1

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIER_EVERY_PARAMETER: dict[str, Any] = {
    "temperature": 0.0,
    "top_p": 0.9,
    "stop": ["\n\n\n"],
    "seed": 7,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "logit_bias": {"50256": -100.0},
    "response_format": {"type": "json_object"},
    "user": "bench-user",
    "logprobs": True,
    "top_logprobs": 2,
    "tools": [WEATHER_TOOL],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
}
"""Every sampling and tool field OpenAI's Chat Completions takes, as the tier gets them."""
EVERY_PARAMETER: dict[str, Any] = {
    **TIER_EVERY_PARAMETER,
    "metadata": {"run": "bench"},
    "n": 1,
}
"""What a client sets on ``/v1`` (``metadata`` and ``n`` stay in the app)."""


def part_ttft(stack: Stack, part: Part) -> None:
    stack.set_delay(0.0)
    max_tokens = stack.args.ttft_max_tokens
    body_direct = direct_body(stack.tokenizer, QUESTION, max_tokens)
    body_openai = {
        "model": "small",
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "rag": {"enabled": False},
        "cache": False,  # every round reaches the tier (no response cache replay)
    }

    body_every = {**body_openai, **EVERY_PARAMETER}
    tier_every = {**body_direct, **TIER_EVERY_PARAMETER}

    def native() -> Stream:
        conversation = new_conversation(stack.app)  # before the clock starts
        return stream_app(stack.app, conversation, app_body(QUESTION, max_tokens))

    surfaces: dict[str, tuple[Callable[[], Stream], dict[str, Any]]] = {
        "native SSE": (native, body_direct),
        "OpenAI /v1/chat/completions": (
            lambda: stream_direct(stack.app, body_openai),
            body_direct,
        ),
        "OpenAI /v1, every parameter set": (
            lambda: stream_direct(stack.app, body_every),
            tier_every,
        ),
    }
    samples = {name: {"app": [], "tier": [], "diff": []} for name in surfaces}
    warmup, rounds = stack.args.warmup, stack.args.rounds
    for number in range(warmup + rounds):
        for name, (run_app, tier_body) in surfaces.items():
            ttft: dict[str, float] = {}
            for kind in ("app", "tier") if number % 2 == 0 else ("tier", "app"):
                stream = run_app() if kind == "app" else stream_direct(stack.tier, tier_body)
                if stream.error:
                    raise RuntimeError(f"{name}, {kind}: {stream.error}")
                ttft[kind] = stream.ttft * 1000.0
            if number >= warmup:
                for kind, value in (*ttft.items(), ("diff", ttft["app"] - ttft["tier"])):
                    samples[name][kind].append(value)
    for name, values in samples.items():
        part.add(f"{name}: added TTFT p50", percentile(values["diff"], 50), " ms", ("<=", 3))
        part.add(f"{name}: added TTFT p99", percentile(values["diff"], 99), " ms", ("<=", 15))
        part.notes.append(
            f"{name}: TTFT p50 app {median(values['app']):.2f} ms, tier "
            f"{median(values['tier']):.2f} ms ({rounds} rounds after {warmup} warm-up, "
            f"max_tokens {max_tokens})"
        )
    # What one answer costs the app's process, one at a time: all its CPU, bookkeeping
    # after the stream included (an answer's tail falls in the next one's span).
    answers = stack.args.cpu_answers
    conversations = iter([new_conversation(stack.app) for _ in range(answers)])
    calls: dict[str, Callable[[], Stream]] = {
        "native SSE": lambda: stream_app(
            stack.app, next(conversations), app_body(QUESTION, max_tokens)
        ),
        "OpenAI /v1/chat/completions": lambda: stream_direct(stack.app, body_openai),
    }
    pid = stack.app_service.process.pid
    for name, call in calls.items():
        before = cpu_seconds(pid)
        for _ in range(answers):
            call()
        cpu_ms = (cpu_seconds(pid) - before) * 1000 / answers
        part.add(f"{name}: app CPU per answer", cpu_ms, " ms")
    part.notes.append(
        f"app CPU per answer: {answers} answers one after another, max_tokens {max_tokens}; "
        "the native surface stores each answer (its two messages, the event journal), the "
        "OpenAI surface by default does not (the ledger row only)"
    )


# --------------------------------------------------------------------------- part 2


def part_admission(stack: Stack, part: Part) -> None:
    store = "redis" if stack.config == "postgres" else "database"
    concurrency = stack.args.admission_concurrency
    cases: list[tuple[int, dict[int, float | None]]] = [
        (8, {50: 2, 99: 20}),
        (1, {50: None, 99: 50}),
    ]
    for teams, targets in cases:
        result = run_configuration(
            store=store,
            redis_url=stack.args.redis_url,
            concurrency=concurrency,
            iterations=stack.args.admission_iterations,
            warmup=concurrency * 2,
            reserve_tokens=1024,
            teams=teams,
        )
        label = f"{concurrency} concurrent, {teams} team{'s' if teams > 1 else ''}"
        for q, bound in targets.items():
            value = percentile(result.samples_ms, q) if result.samples_ms else None
            part.add(f"{label}: p{q}", value, " ms", ("<=", bound) if bound else None)
        # The part before the first token: the reservation alone (settling comes after the
        # last token, off the path users wait on). Same bounds, shown beside.
        for q, bound in targets.items():
            value = percentile(result.reserve_ms, q) if result.reserve_ms else None
            part.add(f"{label}: reserve only p{q}", value, " ms", ("<=", bound) if bound else None)
        rate = len(result.samples_ms) / result.wall_s if result.wall_s else 0.0
        part.notes.append(
            f"{label}: {len(result.samples_ms)} samples, {store} store, {rate:.0f} admissions/s"
            + (f", checks {'ok' if result.ok else 'FAILED'}")
            + "".join(f"; {p}" for p in [*result.errors[:3], *result.checks])
        )


# --------------------------------------------------------------------------- part 3


def part_throughput(stack: Stack, part: Part) -> None:
    stack.set_delay(0.001, paced=True)
    tokens = stack.args.tokens
    counts, goals = (4, 32), {4: 0.97, 32: 0.95}
    stats = measure_throughput(
        app=stack.app,
        tier=stack.tier,
        body_direct=direct_body(stack.tokenizer, STREAM_QUESTION, tokens),
        question=STREAM_QUESTION,
        max_tokens=tokens,
        concurrency=counts,
        reps=stack.args.reps,
        spans=stack.tier_spans,
        cpu=lambda: {
            "app": cpu_seconds(stack.app_service.process.pid),
            "fake": cpu_seconds(stack.tier_service.process.pid),
            "client": time.process_time(),
        },
    )
    for count in counts:
        app_rate = median(stats[("app", count)].aggregate)
        tier_rate = median(stats[("tier", count)].aggregate)
        part.add(
            f"{count} streams: aggregate app/tier",
            app_rate / tier_rate,
            "x",
            (">=", goals[count]),
            3,
        )
        app_wait, tier_wait = stats[("app", count)].wait_ms, stats[("tier", count)].wait_ms
        part.notes.append(
            f"{count} streams: aggregate tokens/s app {app_rate:.0f}, tier {tier_rate:.0f} "
            f"({stack.args.reps} batches each, {tokens} tokens per stream); first token "
            f"p50 / max: app {median(app_wait):.0f} / {max(app_wait):.0f} ms, tier "
            f"{median(tier_wait):.0f} / {max(tier_wait):.0f} ms"
            + (
                f"; the app's response headers p50 / max {median(heads):.0f} / {max(heads):.0f} ms"
                if (heads := stats[("app", count)].headers_ms)
                else ""
            )
            + "; the fake's own tokens/s per stream (p50, nominal 1000) serving the app "
            f"{median(stats[('app', count)].source):.0f}, the direct client "
            f"{median(stats[('tier', count)].source):.0f}"
        )
        app_cpu, tier_cpu = stats[("app", count)].cpu_ms, stats[("tier", count)].cpu_ms
        part.notes.append(
            f"{count} streams: CPU per answer (ms, median of batches): the app "
            f"{median(app_cpu['app']):.1f}; the fake {median(app_cpu['fake']):.1f} serving the "
            f"app, {median(tier_cpu['fake']):.1f} the client; this client "
            f"{median(app_cpu['client']):.1f} from the app, {median(tier_cpu['client']):.1f} "
            "from the fake"
        )


# --------------------------------------------------------------------------- part 4


def content_of(payload: str) -> str:
    """The ``delta.content`` of an OpenAI-style chunk ('' for none, and for ``[DONE]``)."""
    if payload == "[DONE]":
        return ""
    choices = json.loads(payload).get("choices") or []
    return "".join((c.get("delta") or {}).get("content") or "" for c in choices)


async def timed_stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Stream:
    """One streaming POST; the arrival of each content chunk (native ``delta`` events or
    OpenAI chunks) with its text (tokens counted inside, stamps read: ``Stream.add``)."""
    native = path.startswith("/api/")
    result = Stream(time.perf_counter())
    headers = {"Accept": "text/event-stream"} if native else {}
    try:
        async with client.stream("POST", path, json=body, headers=headers) as response:
            if response.status_code != 200:
                result.error = f"{response.status_code}: {(await response.aread())[:200]!r}"
                return result
            event = ""
            async for line in response.aiter_lines():
                now = time.perf_counter()
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif not line.startswith("data:"):
                    continue
                elif not native:
                    if text := content_of(line[5:].strip()):
                        result.add(now, text)
                elif event == "delta":
                    result.add(now, json.loads(line[5:])["text"])
                elif event == "error":
                    result.error = line[5:].strip()[:200]
    except (httpx.HTTPError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    return result


async def open_streams(
    base_url: str, headers: dict[str, str], requests: list[tuple[str, dict[str, Any]]]
) -> list[Stream]:
    """Every request at once from one AsyncClient whose pool holds them all."""
    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=None)
    timeout = httpx.Timeout(600, connect=120, pool=600)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=timeout
    ) as client:
        return await asyncio.gather(*(timed_stream(client, p, b) for p, b in requests))


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


class Sampler(threading.Thread):
    """RSS of the app and its database's connection count, every ``interval`` seconds."""

    def __init__(self, pid: int, database_url: str | None, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.rss_kib: list[int] = []
        self.connections: list[int] = []
        self.stopping = threading.Event()
        self.count: Callable[[], int] | None = None
        if database_url:
            import psycopg

            parts = urlsplit(database_url)
            name = parts.path.lstrip("/")
            conn = psycopg.connect(
                host=parts.hostname or "127.0.0.1",
                port=parts.port or 5432,
                user=parts.username or "postgres",
                password=parts.password or None,
                dbname="postgres",  # not the bench database: this connection is not counted
                autocommit=True,
            )
            self.conn = conn
            sql = "select count(*) from pg_stat_activity where datname = %s"

            def count() -> int:
                row = conn.execute(sql, (name,)).fetchone()
                return int(row[0]) if row else 0

            self.count = count

    def sample(self) -> None:
        self.rss_kib.append(vm_rss_kib(self.pid))
        if self.count:
            self.connections.append(self.count())

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.sample()

    def finish(self) -> None:
        self.stopping.set()
        self.join(timeout=10)
        if self.count:
            self.conn.close()


@dataclass
class Trips:
    """How the tokens of many streams travelled from the tier to the client."""

    all_open: float
    """Seconds from the first request until every stream had its first token."""
    peak: int
    """Most streams open at once."""
    steady: list[float]
    """Trip (tier send -> client) of each token sent while every stream was open, in ms."""
    ramp: list[float]
    """The same for tokens sent before every stream was open."""
    gaps: list[float]
    """Gap between consecutive chunks of a stream minus the tier's delay, in ms (a merged
    chunk counts once, so a late read shows as one long gap)."""


def trip_stats(streams: list[Stream], delay: float) -> Trips:
    good = [s for s in streams if not s.error and s.chunk_times]
    if not good:
        return Trips(0.0, 0, [], [], [])
    edges = sorted([(s.chunk_times[0], 1) for s in good] + [(s.chunk_times[-1], -1) for s in good])
    open_now = peak = 0
    for _, step in edges:
        open_now += step
        peak = max(peak, open_now)
    opened = max(s.chunk_times[0] for s in good)  # the last stream's first token
    closing = min(s.chunk_times[-1] for s in good)  # the first stream's last token
    trips = [trip for s in good for trip in s.trips]
    return Trips(
        all_open=opened - min(s.sent for s in streams),
        peak=peak,
        steady=[t * 1000 for sent, t in trips if opened <= sent < closing],
        ramp=[t * 1000 for sent, t in trips if sent < opened],
        gaps=[
            (later - earlier - delay) * 1000.0
            for s in good
            for earlier, later in itertools.pairwise(s.chunk_times)
        ],
    )


def describe(trips: Trips) -> str:
    def p(values: list[float], q: float) -> str:
        return f"{percentile(values, q):.1f}" if values else "-"

    return (
        f"token trip tier -> client, all {trips.peak} open: p50 {p(trips.steady, 50)} ms, "
        f"p99 {p(trips.steady, 99)} ms ({len(trips.steady)} tokens); while opening "
        f"(all first tokens in {trips.all_open:.1f} s): p50 {p(trips.ramp, 50)} ms, "
        f"p99 {p(trips.ramp, 99)} ms; inter-chunk gap - {1000:.0f} ms: p50 "
        f"{p(trips.gaps, 50)} ms, p99 {p(trips.gaps, 99)} ms"
    )


def part_streams(stack: Stack, part: Part) -> None:
    from django.db import connections

    args = stack.args
    count, tokens, delay = args.streams, args.slow_tokens, 1.0
    stack.set_delay(delay, stamp=True)
    body_direct = direct_body(stack.tokenizer, QUESTION, tokens)
    reference = trip_stats(
        asyncio.run(
            open_streams(stack.tier_url, {}, [("/v1/chat/completions", body_direct)] * count)
        ),
        delay,
    )
    part.notes.append(f"straight to the fake tier (client + fake alone): {describe(reference)}")

    conversations = [new_conversation(stack.app) for _ in range(count)]
    connections.close_all()  # this process's own connection is not the app's
    pid = stack.app_service.process.pid
    sampler = Sampler(pid, args.database_url if stack.config == "postgres" else None)
    sampler.sample()
    rss_before = sampler.rss_kib[0]
    connections_before = sampler.connections[0] if sampler.connections else None
    sampler.start()
    try:
        path = "/api/v1/conversations/{}/messages"
        streams = asyncio.run(
            open_streams(
                stack.app_url,
                {"Authorization": f"Bearer {stack.key}"},
                [(path.format(c), app_body(QUESTION, tokens)) for c in conversations],
            )
        )
    finally:
        sampler.finish()
        stack.set_delay(0.0)
    via_app = trip_stats(streams, delay)
    errors = [s.error for s in streams if s.error]
    complete = sum(1 for s in streams if not s.error and sum(s.chunk_tokens) == tokens)
    added = (
        percentile(via_app.steady, 99) - percentile(reference.steady, 99)
        if via_app.steady and reference.steady
        else None
    )
    part.add("added token delay p99, all open", added, " ms", ("<=", 10))
    rss_peak = max(sampler.rss_kib)
    part.add("memory per open stream", (rss_peak - rss_before) / count, " KiB", digits=1)
    peak_connections = max(sampler.connections) if sampler.connections else None
    part.add("PostgreSQL connections, peak", peak_connections, "", ("<", 20), 0)
    part.notes.append(
        f"via the app ({complete} of {count} complete, {len(errors)} failed, TTFT p50 "
        f"{percentile([s.ttft * 1000 for s in streams if s.chunk_times] or [0.0], 50):.0f} ms "
        f"with the tier's {delay:g} s first): {describe(via_app)}"
    )
    part.notes.append(
        f"uvicorn RSS {rss_before / 1024:.0f} MiB before, {rss_peak / 1024:.0f} MiB peak"
        + ("" if connections_before is None else f"; {connections_before} connections before")
    )
    if errors:
        part.notes.append(f"first errors: {sorted(set(errors))[:3]}")


# --------------------------------------------------------------------------- child / parent


def child(args: argparse.Namespace) -> int:
    """One configuration, every part asked for; results as JSON in ``args.results``."""
    config = args.child
    fd_limit = raise_fd_limit()
    if "4" in args.only and fd_limit < 3 * args.streams:
        print(f"warning: open-file limit {fd_limit} is low for {args.streams} streams")
    data_dir = Path(tempfile.mkdtemp(prefix=f"ragtier-bench-gateway-{config}-"))
    prefix = f"ragtier:bench:gateway:{uuid.uuid4().hex[:12]}:"
    extra = config_env(args, config, prefix)
    if extra:
        for problem in (check_postgres(args.database_url), check_redis(args.redis_url)):
            if problem:
                print(f"error: {problem}", file=sys.stderr)
                return 2
    start_django(service_env(data_dir, **extra, LOG_LEVEL="WARNING"))
    from inference import GGUFTokenizer

    quiet_gc()
    parts: dict[str, Part] = {}
    services = Services(data_dir)
    with contextlib.ExitStack() as cleanup:
        if args.keep:
            print(f"keeping {data_dir} (logs of every service)")
        else:
            cleanup.callback(shutil.rmtree, data_dir, ignore_errors=True)
        if extra:
            cleanup.enter_context(fresh_database())
            cleanup.callback(redis_cleanup, args.redis_url, prefix)
            cleanup.callback(delete_event_buffers, args.redis_url)
        key, _ = setup_data(ingest=False)
        cleanup.callback(services.stop_all)
        fake_port = free_port()
        argv = [sys.executable, "-c", FAKE_UPSTREAM_CODE, str(fake_port), "0"]
        fake = services.start("fake-upstream", argv, service_env(data_dir))
        tier_url = f"http://127.0.0.1:{fake_port}"
        wait_ready(fake, f"{tier_url}/v1/models", timeout=60)
        app_url = start_app(services, "app", data_dir, f"{tier_url}/v1", **APP_ENV, **extra)
        stack = Stack(
            args=args,
            config=config,
            key=key,
            tokenizer=GGUFTokenizer(),
            app_service=services.started[-1],
            tier_service=fake,
            app_url=app_url,
            tier_url=tier_url,
            app=cleanup.enter_context(app_client(app_url, key)),
            tier=cleanup.enter_context(tier_client(tier_url)),
        )
        print(
            f"{CONFIGS[config]}: app {app_url} (pid {stack.app_service.process.pid}), "
            f"fake tier {tier_url}"
        )
        measures = {"1": part_ttft, "2": part_admission, "3": part_throughput, "4": part_streams}
        for number, measure in measures.items():
            if number in args.only:
                run_part(parts, number, lambda part, m=measure: m(stack, part))
                if stack.app_service.process.poll() is not None:
                    print(f"the app exited:\n{stack.app_service.tail()}")
                    break
    report = {"parts": {n: asdict(p) for n, p in parts.items()}}
    Path(args.results).write_text(json.dumps(report))
    return 0


def parent(args: argparse.Namespace, argv: list[str]) -> int:
    configs = list(CONFIGS) if args.config == "both" else [args.config]
    results: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    print(f"{os.cpu_count()} cpus, load average {load_now()} (1 min, 5 min)")
    for config in configs:
        with tempfile.NamedTemporaryFile(suffix=".json") as handle:
            command = [sys.executable, __file__, *argv, "--child", config, "--results", handle.name]
            code = subprocess.call(command, cwd=REPO_ROOT)
            text = Path(handle.name).read_text()
        if code != 0 or not text:
            print(f"{config}: the run failed (exit status {code})")
            continue
        results[config] = json.loads(text)
    print_report(results, configs)
    print()
    print(f"total {time.monotonic() - started:.0f} s")
    return 0 if len(results) == len(configs) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=[*CONFIGS, "both"], default="both")
    parser.add_argument("--only", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--rounds", type=int, default=200, help="part 1: measured rounds")
    parser.add_argument("--warmup", type=int, default=10, help="part 1: unmeasured rounds first")
    parser.add_argument("--ttft-max-tokens", type=int, default=8, help="part 1: max_tokens")
    parser.add_argument(
        "--cpu-answers", type=int, default=100, help="part 1: answers for the CPU per answer"
    )
    parser.add_argument("--admission-concurrency", type=int, default=32, help="part 2")
    parser.add_argument(
        "--admission-iterations", type=int, default=1280, help="part 2: samples per case"
    )
    parser.add_argument("--tokens", type=int, default=500, help="part 3: tokens per stream")
    # Fewer batches leave the median at 4 streams as far apart from run to run as it is
    # from its target (see docs/gateway.md).
    parser.add_argument("--reps", type=int, default=8, help="part 3: batches per count and kind")
    parser.add_argument("--streams", type=int, default=1000, help="part 4: streams at once")
    parser.add_argument("--slow-tokens", type=int, default=60, help="part 4: tokens per stream")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--keep", action="store_true", help="keep the temp folders and logs")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return child(args) if args.child else parent(args, argv)


if __name__ == "__main__":
    raise SystemExit(main())
