"""Context compaction: ``HISTORY_POLICY=drop`` against ``summarize``, side by side, on
the real embedded tier.

What is measured
    The app (uvicorn, one worker, the embedded default: SQLite, the demo corpus ingested
    with the real MiniLM embedder) in front of the real llama.cpp tier (``manage.py
    runinference``, SmolLM2-135M, started with the window the app is told:
    ``--context-window``, 1024 by default so that a conversation overflows in a few turns
    and the run stays short on two cores), once per policy (one app process each, on the
    same tier and data). Each policy asks the first ``--turns`` demo questions
    (``tests/data/demo_questions.json``) in order, in one conversation, streaming, RAG on
    (``top_k`` ``--top-k``), ``max_tokens`` ``--max-tokens``, temperature 0, under the
    purpose tag of its policy: past a few turns the history overflows the window. Per
    answer, from the ``usage`` event: prompt and completion tokens, dropped passages and
    turns, summarised turns, dropped tokens; from the ledger (rows of that tag): the
    summaries' tokens (``operation=summary``) and the cost of answers and summaries at the
    default prices; at the client, the seconds from sending to ``done``. Reported: means per
    answer over every turn, and over the turns that overflowed. Nothing is asserted.

Run (from the repository root)
    HF_HUB_OFFLINE=1 .venv/bin/python bench/compaction.py [--turns 16] [--top-k 3]
        [--max-tokens 96] [--context-window 1024]
The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/compaction.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    Services,
    app_client,
    free_port,
    load_average,
    new_conversation,
    service_env,
    setup_data,
    setup_django,
    start_app,
    wait_ready,
)

POLICIES = ("drop", "summarize")
QUESTIONS = json.loads((REPO_ROOT / "tests" / "data" / "demo_questions.json").read_text())


@dataclass
class Turn:
    usage: dict[str, Any]
    seconds: float


def ask(client: httpx.Client, conversation: int, body: dict[str, Any]) -> Turn:
    sent = time.perf_counter()
    usage: dict[str, Any] = {}
    event = ""
    url = f"/api/v1/conversations/{conversation}/messages"
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "usage":
                usage = json.loads(line[5:])
            elif line.startswith("data:") and event == "error":
                raise RuntimeError(f"the answer failed: {line[5:].strip()}")
    return Turn(usage, time.perf_counter() - sent)


def converse(client: httpx.Client, policy: str, args: argparse.Namespace) -> list[Turn]:
    conversation = new_conversation(client)
    turns = []
    for item in QUESTIONS[: args.turns]:
        body = {
            "content": item["question"],
            "top_k": args.top_k,
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "tag": policy,
            "stream": True,
        }
        turns.append(ask(client, conversation, body))
    return turns


@dataclass
class Figures:
    answers: int
    overflowed: int
    """Answers whose history the window did not hold whole."""
    prompt_tokens: float
    completion_tokens: float
    summary_calls: int
    summary_prompt_tokens: float
    summary_completion_tokens: float
    tokens: float
    """Per answer, everything: its prompt and completion, and the summaries' share."""
    overflowed_tokens: float
    """The same, over the answers that overflowed only (the summaries all fall there)."""
    cost_usd: float
    seconds: float
    dropped_passages: float
    dropped_turns: float
    summarized_turns: float
    dropped_tokens: float


def figures(policy: str, turns: list[Turn]) -> Figures:
    from apps.usage.models import UsageRecord

    def mean(values: Sequence[float]) -> float:
        return round(sum(values) / len(values), 1) if values else 0.0

    rows = list(UsageRecord.objects.filter(tag=policy, kind="chat"))
    summaries = [r for r in rows if r.operation == "summary"]
    used = [t.usage for t in turns]
    over = [u for u in used if u["dropped_turns"] or u["summarized_turns"]]
    n = len(used)
    summary_total = sum(r.prompt_tokens + r.completion_tokens for r in summaries)
    over_tokens = sum(u["prompt_tokens"] + u["completion_tokens"] for u in over)
    return Figures(
        answers=n,
        overflowed=len(over),
        prompt_tokens=mean([u["prompt_tokens"] for u in used]),
        completion_tokens=mean([u["completion_tokens"] for u in used]),
        summary_calls=len(summaries),
        summary_prompt_tokens=round(sum(r.prompt_tokens for r in summaries) / n, 1),
        summary_completion_tokens=round(sum(r.completion_tokens for r in summaries) / n, 1),
        tokens=round((sum(u["total_tokens"] for u in used) + summary_total) / n, 1),
        overflowed_tokens=round((over_tokens + summary_total) / len(over), 1) if over else 0.0,
        cost_usd=float(sum(r.cost_usd for r in rows)) / n,
        seconds=round(sum(t.seconds for t in turns) / n, 2),
        dropped_passages=mean([u["dropped_passages"] for u in used]),
        dropped_turns=mean([u["dropped_turns"] for u in used]),
        summarized_turns=mean([u["summarized_turns"] for u in used]),
        dropped_tokens=mean([u["dropped_tokens"] for u in used]),
    )


def report(results: dict[str, Figures]) -> None:
    names = list(asdict(next(iter(results.values()))))
    print(f"\n{'per answer':<28}" + "".join(f"{p:>14}" for p in results))
    for name in names:
        cells = "".join(f"{asdict(f)[name]:>14.6g}" for f in results.values())
        print(f"{name:<28}{cells}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--context-window", type=int, default=1024)
    parser.add_argument("--keep", action="store_true", help="keep the temp data folder")
    args = parser.parse_args(argv)

    data_dir = Path(tempfile.mkdtemp(prefix="ragtier-bench-compaction-"))
    services = Services(data_dir)
    results: dict[str, Figures] = {}
    try:
        setup_django(data_dir)
        key, ingested = setup_data()
        print(f"data dir {data_dir}; demo corpus: {ingested}; {load_average()}")
        tier_port = free_port()
        argv_tier = [sys.executable, "manage.py", "runinference", "--port", str(tier_port)]
        tier = services.start(
            "tier", [*argv_tier, "--n-ctx", str(args.context_window)], service_env(data_dir)
        )
        tier_url = f"http://127.0.0.1:{tier_port}"
        wait_ready(tier, f"{tier_url}/v1/models", timeout=180)
        for policy in POLICIES:
            extra = {"HISTORY_POLICY": policy, "RESPONSE_CACHE_TTL": "0"}
            url = start_app(
                services,
                f"app-{policy}",
                data_dir,
                f"{tier_url}/v1",
                context_window=args.context_window,
                **extra,
            )
            with app_client(url, key) as client:
                results[policy] = figures(policy, converse(client, policy, args))
            print(f"{policy}: done; {load_average()}", flush=True)
    finally:
        services.stop_all()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    report(results)
    settings = {"turns": args.turns, "top_k": args.top_k, "max_tokens": args.max_tokens}
    window = {"context_window": args.context_window}
    print(json.dumps({**settings, **window, **{p: asdict(f) for p, f in results.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
