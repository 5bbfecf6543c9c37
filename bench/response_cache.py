"""Response cache: TTFT of a cache hit against a miss, side by side, in one run.

What is measured
    The app (uvicorn, one worker, the embedded default: SQLite, the cache in the database)
    answers over the ingested demo corpus (retrieval on, ``top_k`` 5, the real MiniLM
    embedder: a hit still searches, as the query embedding is charged either way). Each
    round asks a new question in a new conversation (a miss: the tier generates it), then
    the same question again, differently cased and spaced, in another new conversation (a
    hit: the stored events are replayed, the tier is not called). TTFT is measured at the
    client, from sending the request to the first ``event: delta`` frame; the app's own
    ``usage.ttft_ms`` (from taking the tier slot, or the replay's start, to the first
    token) is printed beside it, and every hit is checked to say ``cache_hit: true``.
    Two tiers, one table each:
      - the scripted fake tier (``tests.fake_upstream``, in its own process, one token
        every ``--fake-delay`` seconds: the first token too), which isolates the app;
      - the real llama.cpp tier (``manage.py runinference --n-ctx 2048``, SmolLM2-135M),
        unless ``--no-llama``.
    Reported: median and p95 of each, the ratio of medians hit/miss, with the load
    average. Nothing is asserted.

How
    bench.harness: a fresh temp data dir (``DATABASE_URL`` and
    ``REDIS_URL`` dropped), migrate, team ``bench``, an API key, the demo corpus ingested,
    subprocesses on free loopback ports, all stopped at the end.

Run (from the repository root)
    HF_HUB_OFFLINE=1 .venv/bin/python bench/response_cache.py [--rounds 20] [--no-llama]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/response_cache.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    CONTEXT_WINDOW,
    FAKE_UPSTREAM_CODE,
    Services,
    app_client,
    free_port,
    load_average,
    median,
    new_conversation,
    p95,
    service_env,
    setup_data,
    setup_django,
    start_app,
    wait_ready,
)

QUESTIONS = (
    "How are API keys stored?",
    "What does the ingestion pipeline do?",
    "How does the app count tokens?",
    "Which events does an answer stream?",
)


@dataclass
class Answer:
    ttft: float
    """Seconds from sending to the first delta frame, at the client."""
    server_ttft_ms: int | None
    cache_hit: bool


def ask(client: httpx.Client, question: str, max_tokens: int) -> Answer:
    conversation = new_conversation(client)  # before the clock: a single turn
    body = {"content": question, "max_tokens": max_tokens, "stream": True}
    sent = time.perf_counter()
    first: float | None = None
    usage: dict[str, object] = {}
    url = f"/api/v1/conversations/{conversation}/messages"
    event = ""
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
                if event == "delta" and first is None:
                    first = time.perf_counter()
            elif line.startswith("data:") and event == "usage":
                usage = json.loads(line[5:])
            elif line.startswith("data:") and event == "error":
                raise RuntimeError(f"the answer failed: {line[5:].strip()}")
    if first is None:
        raise RuntimeError("no delta arrived")
    ttft_ms = usage.get("ttft_ms")
    return Answer(
        ttft=first - sent,
        server_ttft_ms=int(ttft_ms) if isinstance(ttft_ms, int) else None,
        cache_hit=bool(usage.get("cache_hit")),
    )


def measure(client: httpx.Client, *, tag: str, rounds: int, max_tokens: int) -> None:
    misses: list[Answer] = []
    hits: list[Answer] = []
    ask(client, f"{tag} warm-up question", max_tokens)
    for round_ in range(rounds):
        question = f"{QUESTIONS[round_ % len(QUESTIONS)]} ({tag}, round {round_})"
        misses.append(ask(client, question, max_tokens))
        hits.append(ask(client, f"  {question.upper()}  ", max_tokens))
    wrong = sum(a.cache_hit for a in misses) + sum(not a.cache_hit for a in hits)
    print(f"\n{tag}: {rounds} rounds, max_tokens {max_tokens}; {load_average()}")
    if wrong:
        print(f"  !! {wrong} answers were not the hit or miss expected")
    print(f"{'':<8}{'client median ms':>18}{'p95 ms':>10}{'app ttft_ms median':>20}")
    for name, answers in (("miss", misses), ("hit", hits)):
        client_ms = [a.ttft * 1000 for a in answers]
        server = [a.server_ttft_ms for a in answers if a.server_ttft_ms is not None]
        server_median = f"{median(server):.1f}" if server else "-"
        print(f"{name:<8}{median(client_ms):>18.1f}{p95(client_ms):>10.1f}{server_median:>20}")
    ratio = median([a.ttft for a in hits]) / median([a.ttft for a in misses])
    print(f"TTFT hit/miss (client medians): {ratio:.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--fake-delay", type=float, default=0.02, help="seconds per fake token")
    parser.add_argument("--no-llama", action="store_true", help="skip the llama.cpp tier")
    parser.add_argument("--keep", action="store_true", help="keep the temp data folder")
    args = parser.parse_args(argv)

    data_dir = Path(tempfile.mkdtemp(prefix="ragtier-bench-cache-"))
    services = Services(data_dir)
    try:
        setup_django(data_dir)
        key, ingested = setup_data()
        print(f"data dir {data_dir}; demo corpus: {ingested}; {load_average()}")
        cache = {"RESPONSE_CACHE_TTL": "3600", "RESPONSE_CACHE_REDIS_URL": ""}

        fake_port = free_port()
        fake = services.start(
            "fake-upstream",
            [sys.executable, "-c", FAKE_UPSTREAM_CODE, str(fake_port), str(args.fake_delay)],
            service_env(data_dir),
        )
        fake_url = f"http://127.0.0.1:{fake_port}"
        wait_ready(fake, f"{fake_url}/v1/models", timeout=60)
        app_url = start_app(services, "app-fake", data_dir, f"{fake_url}/v1", **cache)
        with app_client(app_url, key) as client:
            measure(
                client,
                tag=f"fake tier ({args.fake_delay * 1000:.0f} ms a token)",
                rounds=args.rounds,
                max_tokens=args.max_tokens,
            )

        if not args.no_llama:
            tier_port = free_port()
            argv_tier = [sys.executable, "manage.py", "runinference", "--port", str(tier_port)]
            tier = services.start(
                "tier", [*argv_tier, "--n-ctx", str(CONTEXT_WINDOW)], service_env(data_dir)
            )
            tier_url = f"http://127.0.0.1:{tier_port}"
            wait_ready(tier, f"{tier_url}/v1/models", timeout=180)
            app_url = start_app(services, "app-llama", data_dir, f"{tier_url}/v1", **cache)
            with app_client(app_url, key) as client:
                measure(
                    client,
                    tag="llama.cpp tier (SmolLM2-135M)",
                    rounds=args.rounds,
                    max_tokens=args.max_tokens,
                )
    finally:
        services.stop_all()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
