"""Prefix reuse on the embedded tier: TTFT of a long shared prefix, cached against not.

What is measured
    The llama.cpp tier (``manage.py runinference --n-ctx 2048``: SmolLM2-135M-Instruct) in
    its own process. A system prompt of about ``--prefix-tokens`` (1,000) tokens, counted
    with the app's own GGUF tokenizer, built from the demo corpus; each request adds a short
    question and asks for ``max_tokens`` 1. TTFT = send -> first chunk with content, at
    the client (``time.perf_counter``), streaming.
    Each round, in this order:
      - uncached: the same system prompt with a different first line (a round number), so
        nothing of it matches what the tier last evaluated;
      - warm-up: the shared system prompt and question A (not measured);
      - cached: the shared system prompt and question B: everything up to the question
        is already in the tier's KV cache, as for the next turn of a conversation whose
        system prompt and passages are byte-stable (``inference.prompt`` puts the static
        part first for this reason).
    Reported: median and p95 of each, and the ratio of medians cached/uncached (goal <=
    0.7), with the load average. Nothing is asserted.

    llama.cpp's server keeps one sequence's KV cache and reuses the longest common token
    prefix of the next prompt; that is the cache measured here. vLLM's automatic prefix
    caching does the same across many sequences (and reports ``cached_tokens``).

Run (from the repository root)
    .venv/bin/python bench/prefix_reuse.py [--rounds 8] [--prefix-tokens 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/prefix_reuse.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    CONTEXT_WINDOW,
    Services,
    free_port,
    load_average,
    median,
    p95,
    service_env,
    wait_ready,
)

QUESTIONS = ("What does the ingestion pipeline do?", "How are API keys checked?")


def long_prefix(tokens: int) -> str:
    """About ``tokens`` tokens of the demo corpus, counted with the served model's tokenizer."""
    from inference import GGUFTokenizer

    tokenizer = GGUFTokenizer()
    text = "\n\n".join(
        path.read_text() for path in sorted((REPO_ROOT / "demo" / "corpus").glob("*.md"))
    )
    words = text.split(" ")
    low, high = 1, len(words)
    while low < high:  # the most words that fit
        middle = (low + high + 1) // 2
        if tokenizer.count(" ".join(words[:middle])) <= tokens:
            low = middle
        else:
            high = middle - 1
    return "Answer from these notes only.\n\n" + " ".join(words[:low])


def ttft(client: httpx.Client, system: str, question: str) -> float:
    body = {
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 1,
        "stream": True,
    }
    started = time.perf_counter()
    elapsed: float | None = None
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():  # read to the end: the next request starts clean
            if elapsed is None and line.startswith("data:") and '"content"' in line:
                elapsed = time.perf_counter() - started
    if elapsed is None:
        raise RuntimeError("the tier sent no content")
    return elapsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prefix-tokens", type=int, default=1000)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    with tempfile.TemporaryDirectory(prefix="ragtier-prefix-") as folder:
        data_dir = Path(folder)
        services = Services(data_dir)
        try:
            port = free_port()
            argv_tier = [sys.executable, "manage.py", "runinference", "--port", str(port)]
            tier = services.start(
                "tier", [*argv_tier, "--n-ctx", str(CONTEXT_WINDOW)], service_env(data_dir)
            )
            url = f"http://127.0.0.1:{port}"
            wait_ready(tier, f"{url}/v1/models", timeout=180)
            shared = long_prefix(args.prefix_tokens)
            uncached: list[float] = []
            cached: list[float] = []
            with httpx.Client(base_url=url, timeout=300) as client:
                ttft(client, shared, QUESTIONS[0])  # loads the model's weights into cache
                print(f"{args.rounds} rounds, {load_average()}", flush=True)
                for round_ in range(args.rounds):
                    uncached.append(ttft(client, f"Round {round_}.\n{shared}", QUESTIONS[1]))
                    ttft(client, shared, QUESTIONS[0])
                    cached.append(ttft(client, shared, QUESTIONS[1]))
        finally:
            services.stop_all()

    print(f"\nPrefix of {args.prefix_tokens} tokens, SmolLM2-135M on llama.cpp ({load_average()})")
    print(f"{'':<10}{'median ms':>12}{'p95 ms':>10}")
    for name, values in (("uncached", uncached), ("cached", cached)):
        print(f"{name:<10}{median(values) * 1000:>12.1f}{p95(values) * 1000:>10.1f}")
    ratio = median(cached) / median(uncached)
    met = "met" if ratio <= 0.7 else "not met"
    print(f"TTFT cached/uncached (medians): {ratio:.3f}  (goal <= 0.7: {met})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
