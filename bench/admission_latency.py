"""Admission latency (reserve + settle) against the TTFT it adds to, Redis store vs database.

What is measured (one run, printed as one table)
    Admission is what every chat generation pays before and after its model call: the real
    ``apps.usage.budgets.budget_reserve``, called as the answer path calls it
    (``defer_record=True``, the caller's limits from the in-process cache): with the
    database store one transaction (period quota ``UPDATE``, token bucket and stream slot
    rows, ``Reservation`` row); with Redis one Lua call (quotas, bucket, slot), the
    ``Reservation`` row left to be written later. Then ``budget_settle``: one transaction
    that writes the row if it is not there yet, claims the reservation and records the quota
    counter, with, for Redis, the refund (one Lua call) inside it. One sample = reserve time
    + settle time of one request, on ``time.perf_counter``. Four configurations, side by
    side in one run: {Redis store, database store} x {1, 32 concurrent requests}.
    Concurrency is threads started together on a barrier, each running its share of
    ``--iterations`` back to back on its own database connection (closed at its end). The
    team has one team ``Limit`` with a large token bucket (``burst_tokens``,
    ``tokens_per_minute``), large ``daily_tokens`` and ``max_concurrent_streams`` >= the
    concurrency, so every path runs and nothing is refused. Each request reserves
    ``--reserve-tokens`` and settles with ``actual = reserved - refund`` (refund varies per
    request). ``--warmup`` unmeasured requests go first in each configuration.

    Against it, the fake upstream's TTFT (``tests.fake_upstream.fake_upstream()`` on a real
    loopback socket, default script): a streaming ``POST /v1/chat/completions`` with
    httpx, time to the first chunk with non-empty ``delta.content``, median of
    ``--ttft-samples``. That is a floor (no model at all), so each p50/p99 is also given as
    a share of ``--real-ttft-ms`` (default 183 ms, the llama.cpp tier's TTFT measured
    earlier in this project).

    Correctness, per configuration: the team's daily quota counter must equal the sum of
    the ``actual`` tokens settled (warmup included), every reservation must be settled and,
    for Redis, no refund left pending. Printed as ok / FAILED (exit status 1 on FAILED).

How
    Django runs in this process on ``config.settings.base`` with a fresh temp
    ``RAGTIER_DATA_DIR`` and ``DATABASE_URL`` = ``--database-url`` (PostgreSQL, default
    ``postgres://postgres@127.0.0.1:5432/ragtier_bench_admission``): Django's test-database
    machinery (``django.test.utils.setup_databases``) creates that database (dropping a
    leftover one of the same name) and migrates it; it is dropped at the end. The Redis
    store is ``--redis-url`` (default ``redis://127.0.0.1:6379/14``) with keys under a
    unique ``RATE_LIMIT_KEY_PREFIX``, deleted at the end; the store is picked by
    ``settings.RATE_LIMIT_REDIS_URL`` ("" = database). Each configuration uses its own
    team. Both servers are checked first; when one is unreachable the script says so and
    exits with status 2. On a machine with few cores, PostgreSQL, Redis and the client
    threads share them: the load average is printed.

Run
    .venv/bin/python bench/admission_latency.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/admission_latency.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    Result,
    check_postgres,
    check_redis,
    fresh_database,
    percentile,
    redis_cleanup,
    run_configuration,
    setup_django,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/ragtier_bench_admission"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"


# --------------------------------------------------------------------------- fake TTFT


def fake_ttft_ms(samples: int, warmup: int = 5) -> list[float]:
    from tests.fake_upstream import fake_upstream

    body = {
        "model": "fake",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    times: list[float] = []
    with fake_upstream() as upstream, httpx.Client(timeout=10.0) as client:
        url = f"{upstream.base_url}/chat/completions"
        for number in range(warmup + samples):
            started = time.perf_counter()
            first: float | None = None
            with client.stream("POST", url, json=body) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if first is None and line.startswith("data: ") and line != "data: [DONE]":
                        choices = json.loads(line[6:]).get("choices") or []
                        if choices and choices[0].get("delta", {}).get("content"):
                            first = time.perf_counter() - started
                # read to the end so that the connection is reused
            if first is None:
                raise RuntimeError("the fake upstream sent no content chunk")
            if number >= warmup:
                times.append(first * 1000)
    return times


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=300, help="measured per config")
    parser.add_argument("--warmup", type=int, default=32, help="unmeasured per config")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--real-ttft-ms", type=float, default=183.0)
    parser.add_argument("--ttft-samples", type=int, default=50)
    parser.add_argument("--reserve-tokens", type=int, default=1024)
    args = parser.parse_args(argv)
    wall_started = time.perf_counter()

    for problem in (check_postgres(args.database_url), check_redis(args.redis_url)):
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2

    data_dir = Path(tempfile.mkdtemp(prefix="ragtier-bench-admission-"))
    prefix = f"ragtier:bench:admission:{uuid.uuid4().hex[:12]}:"
    # The store is picked per configuration below ("" = database).
    setup_django(
        data_dir,
        DATABASE_URL=args.database_url,
        RATE_LIMIT_REDIS_URL="",
        RATE_LIMIT_KEY_PREFIX=prefix,
    )

    from django.conf import settings
    from django.db import connection

    settings.RATE_LIMIT_KEY_PREFIX = prefix
    results: list[Result] = []
    try:
        with fresh_database() as name:
            server = connection.cursor().connection.info.server_version
            ttft = fake_ttft_ms(args.ttft_samples)
            fake_median = statistics.median(ttft)
            for store in ("redis", "database"):
                for concurrency in args.concurrency:
                    results.append(
                        run_configuration(
                            store=store,
                            redis_url=args.redis_url,
                            concurrency=concurrency,
                            iterations=args.iterations,
                            warmup=args.warmup,
                            reserve_tokens=args.reserve_tokens,
                        )
                    )
    finally:
        removed = redis_cleanup(args.redis_url, prefix)
        shutil.rmtree(data_dir, ignore_errors=True)

    load = os.getloadavg()
    print(
        f"PostgreSQL {server // 10000}.{server % 10000} ({name}, dropped), Redis "
        f"{args.redis_url} (prefix {prefix}, {removed} keys deleted); {os.cpu_count()} CPUs, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        f"admission = budget_reserve + budget_settle, {args.iterations} measured per config "
        f"(+{args.warmup} warmup), reserve {args.reserve_tokens} tokens, settle reserved - refund"
    )
    print(
        f"fake upstream TTFT: median {fake_median:.2f} ms, p95 {percentile(ttft, 95):.2f} ms "
        f"({len(ttft)} samples); realistic TTFT {args.real_ttft_ms:g} ms (--real-ttft-ms)"
    )
    print()
    header = (
        f"{'store':<9}{'conc':>5}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'reserve p50':>12}{'settle p50':>11}{'req/s':>8}"
        f"{'p50 %fake':>10}{'p99 %fake':>10}{'p50 %real':>10}{'p99 %real':>10}  quota"
    )
    print(header)
    print("-" * len(header))
    failed = False
    for result in results:
        if not result.samples_ms:
            print(f"{result.store:<9}{result.concurrency:>5}  no samples  FAILED")
            failed = True
            continue
        p50 = percentile(result.samples_ms, 50)
        p99 = percentile(result.samples_ms, 99)
        rate = len(result.samples_ms) / result.wall_s if result.wall_s else 0.0
        status = "ok" if result.ok else "FAILED"
        failed = failed or not result.ok
        print(
            f"{result.store:<9}{result.concurrency:>5}{len(result.samples_ms):>6}"
            f"{p50:>9.2f}{p99:>9.2f}"
            f"{percentile(result.reserve_ms, 50):>12.2f}{percentile(result.settle_ms, 50):>11.2f}"
            f"{rate:>8.0f}"
            f"{100 * p50 / fake_median:>9.0f}%{100 * p99 / fake_median:>9.0f}%"
            f"{100 * p50 / args.real_ttft_ms:>9.2f}%{100 * p99 / args.real_ttft_ms:>9.2f}%"
            f"  {status}"
        )
        for problem in [*result.errors[:3], *result.checks]:
            print(f"    {problem}")
    print()
    print(f"wall time {time.perf_counter() - wall_started:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
