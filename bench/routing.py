"""Several upstreams: fallback latency, circuit-breaker recovery, and ``auto`` routing's
share and cost on the demo questions, side by side in one run.

What is measured
    The app in this process (uvicorn on a loopback socket, SQLite in a temp folder, the
    demo corpus ingested with the real embedder) in front of two fake OpenAI-compatible
    tiers (``tests/fake_upstream.py``, each on its own socket), with the registry
    (``INFERENCE_MODELS``) switched per part. Both aliases count with the real GGUF
    tokenizer. TTFT = request sent -> first ``delta`` event, at the client
    (``time.perf_counter``), streaming, RAG off in parts 1 and 2 (only the gateway is
    measured). Nothing is asserted.

    1. Fallback added latency: median TTFT over ``--rounds`` answers for
       - direct: ``small`` on one healthy upstream;
       - next upstream after a 503 (the preferred upstream always fails);
       - next upstream after a connect error (the preferred upstream's port is closed);
       - fallback alias after a 503 (``small`` on a failing upstream, ``fallback: large``);
       - black hole, breaker off: the preferred upstream sends headers, then nothing, so
         each answer waits out ``--first-token-timeout`` (3 rounds);
       - black hole, breaker on (``INFERENCE_BREAKER_FAILURES=2``): the rounds after the
         circuit opened.
       Each as its ratio to direct. The conversation used always prefers the faulty
       upstream (rendezvous hashing on its id).
    2. Breaker recovery: the black-holed upstream opens its circuit (2 failures), is
       healed at once, and answers are sent every 50 ms in the conversation that prefers
       it; recovery = heal -> the first answer it serves again, next to the cool-off
       (``--cool-off``), which bounds it.
    3. Routing share and cost: every demo question (``tests/data/demo_questions.json``)
       with ``top_k`` ``--top-k``, as ``auto`` at several ``ROUTER_SMALL_MAX_PROMPT_TOKENS``
       and as ``large``; the share ``auto`` sends to ``small``, and the ledger's total cost
       against always-large, with ``small`` priced at the defaults' estimate and ``large``
       at ``--large-price-factor`` times it. The fake tiers answer three tokens and send
       no usage, so the app counts the prompt itself: cost here is prompt cost.

Run (from the repository root)
    .venv/bin/python bench/routing.py [--rounds 10] [--first-token-timeout 1.0]
        [--cool-off 2.0] [--top-k 5] [--large-price-factor 12.7]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/routing.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    free_port,
    load_average,
    median,
    setup_data,
    setup_django,
)

SMALL_PRICE = {"input": 0.05, "cached_input": 0.025, "output": 0.20}
THRESHOLDS = (750, 1500, 3000)


def registry(**models: dict[str, Any]) -> dict[str, Any]:
    return {
        alias: {"model": f"{alias}-model", "tokenizer": "gguf", "context_window": 8192, **fields}
        for alias, fields in models.items()
    }


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[None]:
    """Settings for one scenario; the registry, queues and breakers are read anew."""
    from django.test import override_settings

    with override_settings(**overrides):
        yield


class App:
    def __init__(self, url: str, key: str) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120
        )

    def conversation(self) -> int:
        return int(self.http.post("/api/v1/conversations", json={}).json()["id"])

    def preferring(self, upstream: str, upstreams: Sequence[str]) -> int:
        """A new conversation whose rendezvous order puts ``upstream`` first."""
        from inference import rendezvous_order

        while True:
            conversation = self.conversation()
            if rendezvous_order(f"conversation:{conversation}", upstreams)[0] == upstream:
                return conversation

    def ttft(self, conversation: int, **body: Any) -> float:
        """Seconds to the first delta (the answer read to its end)."""
        body = {"content": "Where is the key?", "top_k": 0, "stream": True, "cache": False, **body}
        sent = time.perf_counter()
        first: float | None = None
        with self.http.stream(
            "POST", f"/api/v1/conversations/{conversation}/messages", json=body
        ) as response:
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code}: {response.read()!r}")
            for line in response.iter_lines():
                if first is None and line == "event: delta":
                    first = time.perf_counter()
        if first is None:
            raise RuntimeError("no delta arrived")
        return first - sent


def part_fallback(
    app: App, a: Any, b: Any, *, rounds: int, first_token: float, timeouts: dict[str, float]
) -> list[tuple[str, float]]:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    never = {"INFERENCE_BREAKER_FAILURES": 1_000_000}
    quick = {**timeouts, "first_token": first_token, "connect": 1.0}
    rows: list[tuple[str, float]] = []

    def measure(name: str, conversation: int, count: int, **body: Any) -> None:
        rows.append((name, median([app.ttft(conversation, **body) for _ in range(count)])))

    with configured(INFERENCE_MODELS=registry(small={"upstreams": [a.base_url]}), **never):
        app.ttft(app.conversation())  # warm-up: loads the tokenizer, opens connections
        measure("direct", app.conversation(), rounds)
    pair = [a.base_url, b.base_url]
    a.script.fail_status, a.script.fail_times = 503, 10**9
    with configured(INFERENCE_MODELS=registry(small={"upstreams": pair}), **never):
        measure("next upstream after a 503", app.preferring(a.base_url, pair), rounds)
    with configured(
        INFERENCE_MODELS=registry(
            small={"upstreams": [a.base_url], "fallback": "large"},
            large={"upstreams": [b.base_url]},
        ),
        **never,
    ):
        measure("fallback alias after a 503", app.conversation(), rounds)
    a.script.fail_status = None
    with configured(
        INFERENCE_MODELS=registry(small={"upstreams": [dead, b.base_url]}),
        INFERENCE_TIMEOUTS=quick,
        **never,
    ):
        conversation = app.preferring(dead, [dead, b.base_url])
        measure("next upstream after a connect error", conversation, rounds)
    a.script.stall_after = 0
    with configured(
        INFERENCE_MODELS=registry(small={"upstreams": pair}), INFERENCE_TIMEOUTS=quick, **never
    ):
        measure("black hole, breaker off", app.preferring(a.base_url, pair), 3)
    with configured(
        INFERENCE_MODELS=registry(small={"upstreams": pair}),
        INFERENCE_TIMEOUTS=quick,
        INFERENCE_BREAKER_FAILURES=2,
    ):
        conversation = app.preferring(a.base_url, pair)
        for _ in range(2):
            app.ttft(conversation)  # these two open the circuit
        measure("black hole, breaker open", conversation, rounds)
    a.script.stall_after = None
    return rows


def part_recovery(
    app: App, a: Any, b: Any, *, cool_off: float, first_token: float, timeouts: dict[str, float]
) -> float:
    pair = [a.base_url, b.base_url]
    with configured(
        INFERENCE_MODELS=registry(small={"upstreams": pair}),
        INFERENCE_TIMEOUTS={**timeouts, "first_token": first_token},
        INFERENCE_BREAKER_FAILURES=2,
        INFERENCE_BREAKER_COOL_OFF=cool_off,
    ):
        conversation = app.preferring(a.base_url, pair)
        a.script.stall_after = 0
        for _ in range(2):
            app.ttft(conversation)
        a.script.stall_after = None
        healed = time.perf_counter()
        served = len(a.finished_at)
        while len(a.finished_at) == served:
            app.ttft(conversation)
            time.sleep(0.05)
        return time.perf_counter() - healed


def part_routing(
    app: App, a: Any, b: Any, *, top_k: int, factor: float
) -> tuple[dict[int, tuple[float, Decimal]], Decimal, int]:
    from apps.usage.models import UsageRecord

    questions = [
        q["question"]
        for q in json.loads((REPO_ROOT / "tests/data/demo_questions.json").read_text())
    ]
    large_price = {name: price * factor for name, price in SMALL_PRICE.items()}
    models = registry(
        small={"upstreams": [a.base_url], "price": SMALL_PRICE},
        large={"upstreams": [b.base_url], "price": large_price},
    )

    def run(model: str) -> tuple[int, Decimal]:
        """(answers served by small, total cost) for every question."""
        start = UsageRecord.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        for question in questions:
            app.ttft(app.conversation(), content=question, top_k=top_k, model=model)
        rows = UsageRecord.objects.filter(pk__gt=start, kind="chat")
        small = rows.filter(model="small").count()
        return small, sum((r.cost_usd for r in rows), Decimal(0))

    results: dict[int, tuple[float, Decimal]] = {}
    with configured(INFERENCE_MODELS=models):
        _, always_large = run("large")
        for threshold in THRESHOLDS:
            with configured(ROUTER_SMALL_MAX_PROMPT_TOKENS=threshold):
                small, cost = run("auto")
            results[threshold] = (small / len(questions), cost)
    return results, always_large, len(questions)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--first-token-timeout", type=float, default=1.0)
    parser.add_argument("--cool-off", type=float, default=2.0)
    parser.add_argument("--top-k", type=int, default=5)
    # The default prices' ratio (README, "Prices": SmolLM2-1.7B over SmolLM2-135M).
    parser.add_argument("--large-price-factor", type=float, default=12.7)
    args = parser.parse_args(argv)

    os.environ.setdefault("LOG_LEVEL", "ERROR")  # each fallback logs a warning
    os.environ["REQUEST_RATE_PER_SECOND"] = "0"  # its rounds are one team's, back to back
    setup_django(Path(tempfile.mkdtemp(prefix="bench-routing-")))
    from django.conf import settings

    from config.asgi import application
    from tests.fake_upstream import ServerThread, fake_upstream

    key, summary = setup_data()
    print(f"setup: {summary.splitlines()[-1] if summary else 'no corpus'}", flush=True)
    timeouts = dict(settings.INFERENCE_TIMEOUTS)
    with fake_upstream() as a, fake_upstream() as b, ServerThread(application) as url:
        app = App(url, key)
        fallback = part_fallback(
            app, a, b, rounds=args.rounds, first_token=args.first_token_timeout, timeouts=timeouts
        )
        recovery = part_recovery(
            app,
            a,
            b,
            cool_off=args.cool_off,
            first_token=args.first_token_timeout,
            timeouts=timeouts,
        )
        routing, always_large, count = part_routing(
            app, a, b, top_k=args.top_k, factor=args.large_price_factor
        )
        app.http.close()

    direct = fallback[0][1]
    print(f"\n1. fallback before the first token (median TTFT, {args.rounds} rounds)")
    print(f"   {'path':42} {'TTFT ms':>9} {'added ms':>9} {'x direct':>9}")
    for name, value in fallback:
        print(
            f"   {name:42} {value * 1000:9.1f} {(value - direct) * 1000:9.1f} {value / direct:9.2f}"
        )
    print(f"   (first-token timeout {args.first_token_timeout:g} s)")
    print("\n2. breaker recovery after the upstream heals")
    print(
        f"   recovered in {recovery:.2f} s; cool-off {args.cool_off:g} s "
        f"(ratio {recovery / args.cool_off:.2f})"
    )
    print(
        f"\n3. auto routing on {count} demo questions (top_k {args.top_k}; large priced "
        f"{args.large_price_factor:g}x small)"
    )
    print(
        f"   {'threshold':>10} {'to small':>9} {'cost USD':>12} {'x always-large':>15} {'saved':>7}"
    )
    for threshold, (share, cost) in routing.items():
        ratio = float(cost / always_large) if always_large else 0.0
        print(f"   {threshold:>10} {share:9.0%} {float(cost):12.8f} {ratio:15.2f} {1 - ratio:7.0%}")
    print(f"   {'always large':>10} {'0%':>9} {float(always_large):12.8f} {1.0:15.2f} {'0%':>7}")
    print(f"\n{load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
