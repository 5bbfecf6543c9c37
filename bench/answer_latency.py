"""Answer latency and throughput of the app against the inference tier it calls, side by side.

What is measured (one run, three parts, each printed as a table)
    1. TTFT, app against tier. The same question goes, interleaved round by round, to
       the app's native SSE endpoint (``POST /api/v1/conversations/<id>/messages`` with
       ``top_k: 0``, so retrieval is off and the app sends system prompt + question) and
       straight to the tier's ``/v1/chat/completions`` (streaming) with the very messages
       the app sends, built with ``inference.assemble_prompt`` and the real GGUFTokenizer,
       and the body ``inference.ChatRequest`` builds (same model name, ``max_tokens``,
       ``stream_options``; no temperature, as the app passes none). TTFT is the time from
       sending the request to the first content delta the client receives: the first
       ``event: delta`` frame from the app, the first chunk with a non-empty
       ``delta.content`` from the tier. Each app request uses a new conversation (no
       history), created before the clock starts. Before every measured request a short
       "flush" request with another question (``max_tokens`` 1) goes to the tier, so
       llama.cpp's prefix cache holds only the shared system prompt each time, as it would
       for a new question (``--no-flush`` measures fully cached prompts instead).
       Reported: median and p95 of each, the median of per-round ratios app/tier, the
       ratio of medians and the median of per-round differences in ms.
    2. The whole retrieval stage as a share of TTFT for a ~1,000-token prompt, in this
       process: ``apps.knowledge.services.chunk_search`` (embed with the real MiniLM,
       FAISS search, usage row, chunk fetch) over the ingested demo corpus, then
       ``inference.assemble_prompt`` with the real GGUFTokenizer (passages rendered, fitted
       into the 2,048-token window and counted). ``top_k`` is the number of best chunks
       (at most ``--rag-max-top-k``) whose prompt comes closest to ``--rag-prompt-tokens``.
       Against it, the tier's TTFT for that same prompt by a direct streaming call: "cold"
       after a flush request (only the system prompt cached, as for a new question) and
       "warm" (the same prompt sent again at once: fully cached). Reported: medians and
       p95, retrieval / (retrieval + TTFT) and retrieval / TTFT.
    3. Tokens/s arriving at an SSE client, app against tier, at each ``--concurrency``
       (default 1 and 4 streams at once, started together from threads), ``--stream-reps``
       times each. A stream's rate is its tokens / (last chunk time - request sent),
       counting ``delta`` events for the app and chunks with non-empty ``delta.content`` for
       the tier (llama.cpp sends one token per chunk). The app merges the tokens that reach
       it in one read into one ``delta``; the fake tier's tokens (`` t0``, `` t1``, ...) are
       counted inside it, any other text as one token per chunk. A batch's aggregate rate is
       all tokens / (last chunk of any stream - first request sent): spans from the request,
       so a burst of merged tokens is not flattered. Reported: median per-stream and
       aggregate rates and their ratios app/tier, chunks per stream, and the median wait to
       a stream's first token. The real tier serves one request at a time, so concurrent
       streams queue behind each other. The same is then measured against the scripted fake
       upstream (``tests.fake_upstream``, one token every ``--fake-delays`` seconds on a
       fixed schedule, 10 ms and 1 ms by default, streams served concurrently; see
       ``Script.paced``), which isolates the app's own
       overhead (``--no-fake`` skips it). The fake also records what the app sends: before
       part 1 the script checks that the app's request body is exactly the one sent
       directly.

How
    A fresh temp ``RAGTIER_DATA_DIR`` (new SQLite file, index files, logs; ``DATABASE_URL``
    and ``REDIS_URL`` are dropped: the embedded default). Django runs in this process on
    ``config.settings.base`` to migrate, create the team ``bench``, print an API key and
    ingest ``demo/corpus/`` (the same as ``manage.py migrate``, ``createteam``,
    ``createapikey``, ``ingest``) and for part 2. Subprocesses, on free loopback ports:
    the llama.cpp tier (``manage.py runinference --n-ctx 2048``: SmolLM2-135M-Instruct,
    ``interrupt_requests=False``), the app (``uvicorn config.asgi:application``, as
    ``runstack`` starts it) with ``INFERENCE_BASE_URL`` pointing at the tier,
    ``MODEL_SMALL_CONTEXT_WINDOW=2048`` and ``INFERENCE_RUN_LOCAL=false``; and for the
    fake part the fake upstream and a second app pointing at it. ``--warmup`` unmeasured
    requests go first. Wall clock via ``time.perf_counter`` in one httpx client per target
    (kept-alive connections); nothing is asserted. On a machine with few cores the tier,
    the app and this client share them: the load average is printed with each part.
    Everything started is stopped at the end; the temp folder is removed unless ``--keep``.

Run
    HF_HUB_OFFLINE=1 .venv/bin/python bench/answer_latency.py
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/answer_latency.py``
    sys.path.insert(0, str(REPO_ROOT))

CONTEXT_WINDOW = 2048
TEAM = "bench"
COLLECTION = "ragtier-docs"
FLUSH_QUESTION = "Say hello."

# The fake tier in its own process (so this client's threads do not slow it down), with a
# route that returns the request bodies it recorded.
FAKE_UPSTREAM_CODE = """
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fake_upstream import FakeUpstream, Script

port, delay = int(sys.argv[1]), float(sys.argv[2])
upstream = FakeUpstream(script=Script(emit_max_tokens=True, delay=delay))


async def recorded(request):
    return JSONResponse(upstream.requests[-int(request.query_params.get("last", "1")) :])


async def set_delay(request):
    upstream.script.delay = float(request.query_params["seconds"])
    upstream.script.stamp = request.query_params.get("stamp") == "1"
    upstream.script.paced = request.query_params.get("paced") == "1"
    return JSONResponse({"delay": upstream.script.delay, "stamp": upstream.script.stamp})


async def spans(request):
    taken = list(upstream.spans)
    upstream.spans.clear()
    return JSONResponse(taken)


routes = [
    Route("/bench/spans", spans),
    Route("/bench/requests", recorded),
    Route("/bench/delay", set_delay, methods=["POST"]),
]
app = Starlette(routes=[*upstream.app().routes, *routes])
from bench.answer_latency import quiet_gc
quiet_gc()
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def quiet_gc() -> None:
    """The measuring processes (the client, the fake tier) collect garbage as the app's web
    process does (``apps.site.warmup``): startup heap frozen, young generation collected
    every 10,000 allocations. Their own collection pauses would otherwise be counted as
    the app's."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 50, 100)


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        # Started in its own session: the group is this service and any child it made.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)


class Services:
    """Subprocesses started by this run; all of them are stopped by ``stop_all``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Service] = []

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Service:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as handle:
            process = subprocess.Popen(
                list(argv),
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        service = Service(name, process, log)
        self.started.append(service)
        return service

    def stop_all(self) -> None:
        for service in reversed(self.started):
            service.stop()


def wait_ready(service: Service, url: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise RuntimeError(
                f"{service.name} exited with {service.process.returncode}:\n{service.tail()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.25)
    raise RuntimeError(
        f"{service.name} not ready at {url} after {timeout:.0f} s:\n{service.tail()}"
    )


def service_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "STREAM_BUFFER_REDIS_URL"):
        env.pop(name, None)  # the embedded default: never a database named by the environment
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.base",
        RAGTIER_DATA_DIR=str(data_dir),
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        # One bench client stands in for many teams' clients: no per-team request rate.
        REQUEST_RATE_PER_SECOND="0",
    )
    env.update(extra)
    return env


def start_app(
    services: Services, name: str, data_dir: Path, inference_base_url: str, **extra: str
) -> str:
    """Start the app under uvicorn (one worker) on a free port; ``extra`` goes into its env."""
    port = free_port()
    env = service_env(
        data_dir,
        INFERENCE_BASE_URL=inference_base_url,
        INFERENCE_RUN_LOCAL="false",
        MODEL_SMALL_CONTEXT_WINDOW=str(CONTEXT_WINDOW),
        **extra,
    )
    argv = [sys.executable, "-m", "uvicorn", "config.asgi:application"]
    service = services.start(name, [*argv, "--host", "127.0.0.1", "--port", str(port)], env)
    url = f"http://127.0.0.1:{port}"
    wait_ready(service, f"{url}/healthz", timeout=120)
    return url


# --------------------------------------------------------------------------- Django setup


def setup_django(data_dir: Path) -> None:
    """Configure and start Django on the fresh data folder; must run before any app import."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.base"
    os.environ["RAGTIER_DATA_DIR"] = str(data_dir)
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "STREAM_BUFFER_REDIS_URL"):
        os.environ.pop(name, None)
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import django

    django.setup()


def setup_data(*, ingest: bool = True) -> tuple[str, str]:
    """Migrate, create the team and a key, ingest the demo corpus; (key, ingest summary).

    ``ingest=False`` skips the corpus (no embedding model loaded); the summary is then "".
    """
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("createteam", TEAM, stderr=StringIO())
    out = StringIO()
    call_command("createapikey", team=TEAM, stdout=out)
    if not ingest:
        return out.getvalue().strip(), ""
    summary = StringIO()
    call_command(
        "ingest",
        str(REPO_ROOT / "demo" / "corpus"),
        team=TEAM,
        collection=COLLECTION,
        no_progress=True,
        stdout=summary,
        stderr=StringIO(),
    )
    return out.getvalue().strip(), summary.getvalue().strip()


# --------------------------------------------------------------------------- streaming clients


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
    from apps.chat.services.models import model_alias_resolve
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


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cpus"


# --------------------------------------------------------------------------- part 1


def check_same_prompt(
    app: httpx.Client, fake: httpx.Client, expected: dict[str, Any], question: str, n: int
) -> str:
    """What the app sent the (fake) tier for ``question``, compared with ``expected``."""
    stream = stream_app(app, new_conversation(app), app_body(question, n))
    if stream.error:
        return f"could not check: the app answered {stream.error}"
    sent = fake.get("/bench/requests").json()[-1]
    keys = sorted(set(sent) | set(expected))
    different = [key for key in keys if sent.get(key) != expected.get(key)]
    if not different:
        return "identical request bodies (messages, model, max_tokens, stream options)"
    return "DIFFERENT in " + ", ".join(
        f"{key}: app {sent.get(key)!r} / direct {expected.get(key)!r}" for key in different
    )


def part_ttft(
    *,
    app: httpx.Client,
    tier: httpx.Client,
    body_direct: dict[str, Any],
    body_flush: dict[str, Any] | None,
    question: str,
    max_tokens: int,
    rounds: int,
    warmup: int,
) -> None:
    print()
    print(f"== 1. TTFT: app (top_k 0) against the tier directly, same prompt; {load_average()}")
    samples: dict[str, list[float]] = {"app": [], "tier": []}

    def measure(kind: str) -> float:
        if body_flush is not None:
            stream_direct(tier, body_flush)
        if kind == "app":
            conversation = new_conversation(app)
            stream = stream_app(app, conversation, app_body(question, max_tokens))
        else:
            stream = stream_direct(tier, body_direct)
        if stream.error:
            raise RuntimeError(f"{kind}: {stream.error}")
        return stream.ttft * 1000.0

    for _ in range(warmup):
        measure("app")
        measure("tier")
    for number in range(rounds):
        order = ("app", "tier") if number % 2 == 0 else ("tier", "app")
        for kind in order:
            samples[kind].append(measure(kind))

    app_ms, tier_ms = samples["app"], samples["tier"]
    ratios = [a / t for a, t in zip(app_ms, tier_ms, strict=True)]
    differences = [a - t for a, t in zip(app_ms, tier_ms, strict=True)]
    print(
        f"{rounds} rounds, interleaved (order alternating), after {warmup} warm-up pairs; "
        f"max_tokens {max_tokens}; prompt {body_direct['messages'][-1]['content']!r}; "
        f"{'flush request before each' if body_flush else 'no flush: fully cached prompts'}"
    )
    print(f"{'':<28}  {'median ms':>10}  {'p95 ms':>10}  {'min ms':>10}")
    print(
        f"{'app SSE (first delta)':<28}  {median(app_ms):>10.1f}  {p95(app_ms):>10.1f}"
        f"  {min(app_ms):>10.1f}"
    )
    print(
        f"{'tier direct (first content)':<28}  {median(tier_ms):>10.1f}  {p95(tier_ms):>10.1f}"
        f"  {min(tier_ms):>10.1f}"
    )
    print(f"app / tier, median of per-round ratios  {median(ratios):>8.2f}x")
    print(f"app / tier, ratio of medians            {median(app_ms) / median(tier_ms):>8.2f}x")
    print(
        f"app - tier, median of per-round diffs   {median(differences):>8.1f} ms"
        f"  (p95 {p95(differences):.1f} ms)"
    )


# --------------------------------------------------------------------------- part 2


def part_retrieval_share(
    *,
    tier: httpx.Client,
    tokenizer: Any,
    question: str,
    max_top_k: int,
    prompt_tokens: int,
    max_tokens: int,
    body_flush: dict[str, Any],
    retrieval_rounds: int,
    ttft_rounds: int,
) -> None:
    from apps.accounts.selectors import Caller, team_get_by_name
    from apps.chat.services.models import model_alias_resolve
    from apps.knowledge.services import chunk_search
    from inference import ChatRequest, Passage, assemble_prompt

    print()
    print(
        f"== 2. Retrieval stage against tier TTFT, ~{prompt_tokens}-token prompt; {load_average()}"
    )
    team = team_get_by_name(name=TEAM)
    if team is None:
        raise RuntimeError("the bench team is missing")
    caller = Caller(team, None, None, frozenset({"read"}))
    served_name = model_alias_resolve(alias=None).model

    def passages_of(results: Sequence[Any]) -> list[Passage]:
        return [
            Passage(r.chunk.document.title, r.chunk.text, tuple(r.chunk.headings)) for r in results
        ]

    def assemble(passages: list[Passage]) -> Any:
        return assemble_prompt(
            tokenizer=tokenizer,
            question=question,
            passages=passages,
            context_window=CONTEXT_WINDOW,
            max_output_tokens=max_tokens,
        )

    # top_k: how many of the best chunks make the prompt closest to ``prompt_tokens``.
    ranked = passages_of(chunk_search(caller=caller, query=question, top_k=max_top_k))
    sizes = {k: assemble(ranked[:k]).prompt_tokens for k in range(1, len(ranked) + 1)}
    top_k = min(sizes, key=lambda k: abs(sizes[k] - prompt_tokens))

    def retrieve() -> tuple[Any, float, float]:
        started = time.perf_counter()
        results = chunk_search(caller=caller, query=question, top_k=top_k)
        searched = time.perf_counter()
        prompt = assemble(passages_of(results))
        assembled = time.perf_counter()
        return prompt, (searched - started) * 1000.0, (assembled - searched) * 1000.0

    prompt, _, _ = retrieve()  # warm-up: loads the model, the index and the tokenizer
    body = ChatRequest(model=served_name, messages=prompt.messages, max_tokens=max_tokens).body()
    stream_direct(tier, body_flush)
    stream_direct(tier, body)  # warm-up of the tier
    samples: dict[str, list[float]] = {"search": [], "assemble": [], "cold": [], "warm": []}
    for number in range(max(retrieval_rounds, ttft_rounds)):
        if number < retrieval_rounds:
            again, search_ms, assemble_ms = retrieve()
            if again.messages != prompt.messages:
                raise RuntimeError("the assembled prompt changed between rounds")
            samples["search"].append(search_ms)
            samples["assemble"].append(assemble_ms)
        if number < ttft_rounds:
            stream_direct(tier, body_flush)
            for kind in ("cold", "warm"):  # the second one finds the whole prompt cached
                stream = stream_direct(tier, body)
                if stream.error:
                    raise RuntimeError(f"tier: {stream.error}")
                samples[kind].append(stream.ttft * 1000.0)

    total = [s + a for s, a in zip(samples["search"], samples["assemble"], strict=True)]
    retrieval = median(total)
    print(
        f"question {question!r}: top_k {top_k} (closest to {prompt_tokens} tokens of 1..."
        f"{len(ranked)}), {len(prompt.passages)} passages in the prompt, "
        f"{prompt.prompt_tokens} tokens; "
        f"retrieval {retrieval_rounds} rounds, TTFT {ttft_rounds} rounds, max_tokens {max_tokens}"
    )
    print(f"{'':<46}  {'median ms':>10}  {'p95 ms':>10}")
    rows = [
        ("chunk_search (embed + search + usage + fetch)", samples["search"]),
        ("assemble_prompt (render + fit + count)", samples["assemble"]),
        ("retrieval stage total", total),
        ("tier TTFT, cold (system prompt cached only)", samples["cold"]),
        ("tier TTFT, warm (whole prompt cached)", samples["warm"]),
    ]
    for label, values in rows:
        print(f"{label:<46}  {median(values):>10.1f}  {p95(values):>10.1f}")
    for kind in ("cold", "warm"):
        ttft = median(samples[kind])
        print(
            f"{kind:>4}: retrieval / (retrieval + TTFT) {retrieval / (retrieval + ttft):>7.1%}"
            f"   retrieval / TTFT {retrieval / ttft:>8.3f}x"
        )


# --------------------------------------------------------------------------- part 3


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


def part_throughput(
    *,
    title: str,
    app: httpx.Client,
    tier: httpx.Client,
    body_direct: dict[str, Any],
    question: str,
    max_tokens: int,
    concurrency: Sequence[int],
    reps: int,
) -> None:
    print()
    print(f"== 3{title}; {load_average()}")
    stats = measure_throughput(
        app=app,
        tier=tier,
        body_direct=body_direct,
        question=question,
        max_tokens=max_tokens,
        concurrency=concurrency,
        reps=reps,
    )
    print(
        f"max_tokens {max_tokens}, {reps} reps per concurrency, order alternating; "
        "rates in tokens/s (tokens in content chunks); medians"
    )
    print(
        f"{'':>7}  {'per-stream tokens/s':^26}  {'aggregate tokens/s':^26}  "
        f"{'chunks/stream':^13}  {'wait to 1st ms':^15}"
    )
    print(
        f"{'streams':>7}  {'tier':>7} {'app':>7} {'app/tier':>10}  "
        f"{'tier':>7} {'app':>7} {'app/tier':>10}  {'tier':>6} {'app':>6}  {'tier':>7} {'app':>7}"
    )
    for count in concurrency:
        a, t = stats[("app", count)], stats[("tier", count)]
        app_rate, tier_rate = median(a.per_stream), median(t.per_stream)
        app_total, tier_total = median(a.aggregate), median(t.aggregate)
        print(
            f"{count:>7}  {tier_rate:>7.1f} {app_rate:>7.1f} {app_rate / tier_rate:>9.3f}x  "
            f"{tier_total:>7.1f} {app_total:>7.1f} {app_total / tier_total:>9.3f}x  "
            f"{median(t.chunks):>6.0f} {median(a.chunks):>6.0f}  "
            f"{median(t.wait_ms):>7.0f} {median(a.wait_ms):>7.0f}"
        )


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="part 1: rounds (app + tier)")
    parser.add_argument("--warmup", type=int, default=3, help="part 1: unmeasured pairs first")
    parser.add_argument("--max-tokens", type=int, default=16, help="part 1 and 2: max_tokens")
    parser.add_argument("--question", default="How are API keys stored?", help="part 1")
    parser.add_argument(
        "--no-flush", action="store_true", help="part 1: no flush request before each"
    )
    parser.add_argument(
        "--rag-question",
        default="How does ragtier count tokens, reserve quota and settle usage for an answer?",
        help="part 2",
    )
    parser.add_argument(
        "--rag-max-top-k", type=int, default=8, help="part 2: most chunks considered"
    )
    parser.add_argument(
        "--rag-prompt-tokens", type=int, default=1000, help="part 2: prompt size aimed at"
    )
    parser.add_argument("--rag-rounds", type=int, default=20, help="part 2: retrieval rounds")
    parser.add_argument(
        "--rag-ttft-rounds", type=int, default=10, help="part 2: tier TTFT rounds (cold + warm)"
    )
    parser.add_argument(
        "--stream-question",
        default="Write a long, detailed story about a lighthouse keeper and a storm.",
        help="part 3",
    )
    parser.add_argument("--stream-max-tokens", type=int, default=128, help="part 3: max_tokens")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4], help="part 3")
    parser.add_argument("--stream-reps", type=int, default=4, help="part 3: reps per concurrency")
    parser.add_argument(
        "--fake-delays",
        type=float,
        nargs="+",
        default=[0.01, 0.001],
        help="part 3b: seconds per fake token, one table each",
    )
    parser.add_argument("--no-fake", action="store_true", help="skip the fake-upstream part")
    parser.add_argument("--keep", action="store_true", help="keep the temp data folder and logs")
    args = parser.parse_args(argv)

    started = time.monotonic()
    data_dir = Path(tempfile.mkdtemp(prefix="ragtier-bench-answer-"))
    services = Services(data_dir)
    clients: list[httpx.Client] = []
    try:
        setup_django(data_dir)
        from inference import GGUFTokenizer, smollm2_gguf_path

        print(f"data dir: {data_dir}; {load_average()}")
        setup_started = time.monotonic()
        key, ingested = setup_data()
        print(
            f"setup (migrate, team, key, ingest demo corpus: {ingested}): "
            f"{time.monotonic() - setup_started:.1f} s"
        )
        tokenizer = GGUFTokenizer()

        tier_port = free_port()
        tier_service = services.start(
            "tier",
            [
                sys.executable,
                "manage.py",
                "runinference",
                "--port",
                str(tier_port),
                "--n-ctx",
                str(CONTEXT_WINDOW),
            ],
            service_env(data_dir),
        )
        tier_url = f"http://127.0.0.1:{tier_port}"
        wait_ready(tier_service, f"{tier_url}/v1/models", timeout=180)
        app_url = start_app(services, "app", data_dir, f"{tier_url}/v1")
        tier = tier_client(tier_url)
        app = app_client(app_url, key)
        clients += [tier, app]
        print(
            f"tier: llama.cpp server, {smollm2_gguf_path().name}, n_ctx {CONTEXT_WINDOW}, "
            f"{tier_url}; app: uvicorn config.asgi:application, {app_url}"
        )

        body_direct = direct_body(tokenizer, args.question, args.max_tokens)
        body_flush = direct_body(tokenizer, FLUSH_QUESTION, 1)

        fake: httpx.Client | None = None
        fake_app: httpx.Client | None = None
        if not args.no_fake:
            fake_port = free_port()
            fake_service = services.start(
                "fake-upstream",
                [
                    sys.executable,
                    "-c",
                    FAKE_UPSTREAM_CODE,
                    str(fake_port),
                    str(args.fake_delays[0]),
                ],
                service_env(data_dir),
            )
            fake_url = f"http://127.0.0.1:{fake_port}"
            wait_ready(fake_service, f"{fake_url}/v1/models", timeout=60)
            fake_app_url = start_app(services, "app-on-fake", data_dir, f"{fake_url}/v1")
            fake, fake_app = tier_client(fake_url), app_client(fake_app_url, key)
            clients += [fake, fake_app]
            print(
                "what the app sends for part 1's question (checked on the fake upstream): "
                + check_same_prompt(fake_app, fake, body_direct, args.question, args.max_tokens)
            )

        part_ttft(
            app=app,
            tier=tier,
            body_direct=body_direct,
            body_flush=None if args.no_flush else body_flush,
            question=args.question,
            max_tokens=args.max_tokens,
            rounds=args.rounds,
            warmup=args.warmup,
        )
        part_retrieval_share(
            tier=tier,
            tokenizer=tokenizer,
            question=args.rag_question,
            max_top_k=args.rag_max_top_k,
            prompt_tokens=args.rag_prompt_tokens,
            max_tokens=args.max_tokens,
            body_flush=body_flush,
            retrieval_rounds=args.rag_rounds,
            ttft_rounds=args.rag_ttft_rounds,
        )
        stream_body = direct_body(tokenizer, args.stream_question, args.stream_max_tokens)
        part_throughput(
            title=". Tokens/s at an SSE client: app against the llama.cpp tier",
            app=app,
            tier=tier,
            body_direct=stream_body,
            question=args.stream_question,
            max_tokens=args.stream_max_tokens,
            concurrency=args.concurrency,
            reps=args.stream_reps,
        )
        if fake is not None and fake_app is not None:
            for delay in args.fake_delays:
                params = {"seconds": delay, "paced": 1}  # a tier's own rate: see Script.paced
                fake.post("/bench/delay", params=params).raise_for_status()
                part_throughput(
                    title=(
                        f"b. Tokens/s at an SSE client: app against the fake upstream "
                        f"(one token every {delay * 1000:g} ms, concurrent streams)"
                    ),
                    app=fake_app,
                    tier=fake,
                    body_direct=stream_body,
                    question=args.stream_question,
                    max_tokens=args.stream_max_tokens,
                    concurrency=args.concurrency,
                    reps=args.stream_reps,
                )
        print()
        print(f"total {time.monotonic() - started:.0f} s")
    finally:
        for client in clients:
            client.close()
        services.stop_all()
        if args.keep:
            print(f"kept {data_dir} (logs: {', '.join(s.log.name for s in services.started)})")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
