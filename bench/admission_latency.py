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
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/admission_latency.py``
    sys.path.insert(0, str(REPO_ROOT))

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/ragtier_bench_admission"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"
LARGE = 10**15


# --------------------------------------------------------------------------- helpers


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank-interpolated percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def check_postgres(database_url: str) -> str | None:
    """None when the server answers; otherwise why not."""
    import psycopg

    parts = urlsplit(database_url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        return f"--database-url must be a PostgreSQL URL, got {parts.scheme!r}"
    try:
        conn = psycopg.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5432,
            user=parts.username or "postgres",
            password=parts.password or None,
            dbname="postgres",
            connect_timeout=3,
        )
        conn.close()
    except Exception as exc:  # any failure means unreachable
        return f"PostgreSQL at {parts.hostname}:{parts.port or 5432} is unreachable: {exc}"
    return None


def check_redis(redis_url: str) -> str | None:
    import redis

    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=2).ping()
    except Exception as exc:
        return f"Redis at {redis_url} is unreachable: {exc}"
    return None


def setup_django(data_dir: Path, database_url: str) -> None:
    """Configure and start Django; must run before any app import."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
    os.environ["RAGTIER_DATA_DIR"] = str(data_dir)
    os.environ["DATABASE_URL"] = database_url
    os.environ["RATE_LIMIT_REDIS_URL"] = ""  # set per configuration below
    os.environ.setdefault("LOG_LEVEL", "WARNING")

    import django

    django.setup()


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """Create settings' PostgreSQL database (dropping a leftover one of the same name) and
    migrate it, with Django's test-database machinery; drop it at the end. Yields its name.
    """
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    name = settings.DATABASES["default"]["NAME"]
    settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = name
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        yield name
    finally:
        connection.close()
        teardown_databases(old_config, verbosity=0)


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


# --------------------------------------------------------------------------- admission


@dataclass
class Result:
    store: str
    concurrency: int
    samples_ms: list[float] = field(default_factory=list)
    reserve_ms: list[float] = field(default_factory=list)
    settle_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.checks


def run_configuration(
    *,
    store: str,
    redis_url: str,
    concurrency: int,
    iterations: int,
    warmup: int,
    reserve_tokens: int,
    teams: int = 1,
) -> Result:
    """Reserve + settle from ``concurrency`` threads; thread i charges team ``i % teams``."""
    from django.conf import settings
    from django.db import connection

    from apps.accounts.models import Team
    from apps.accounts.services import team_create
    from apps.usage.budgets import budget_reserve, budget_settle, limits_cache
    from apps.usage.models import Limit, QuotaCounter, Reservation

    settings.RATE_LIMIT_REDIS_URL = redis_url if store == "redis" else ""
    run = uuid.uuid4().hex[:8]
    team_list = [
        team_create(name=f"bench-admission-{store}-{concurrency}-{run}-{number}")
        for number in range(teams)
    ]
    limits = [
        Limit.objects.create(
            team=team,
            burst_tokens=LARGE,
            tokens_per_minute=LARGE,
            daily_tokens=LARGE,
            max_concurrent_streams=max(64, concurrency * 2),
        )
        for team in team_list
    ]
    result = Result(store, concurrency)
    lock = threading.Lock()
    settled_total = [0]
    per_thread = [iterations // concurrency] * concurrency
    for index in range(iterations % concurrency):
        per_thread[index] += 1
    warm_per_thread = max(1, warmup // concurrency)
    barrier = threading.Barrier(concurrency + 1)

    def one(team: Team, number: int) -> tuple[float, float, int]:
        refund = 1 + number % (reserve_tokens // 2)
        started = time.perf_counter()
        reservation = budget_reserve(
            team=team,
            api_key=None,
            tokens=reserve_tokens,
            defer_record=True,
            limits=limits_cache.get(team=team, api_key=None),  # as the answer path reads them
        )
        reserved = time.perf_counter()
        actual = reserve_tokens - refund
        budget_settle(reservation=reservation, actual=actual)
        done = time.perf_counter()
        return reserved - started, done - reserved, actual

    def worker(index: int) -> None:
        local: list[tuple[float, float]] = []
        total = 0
        team = team_list[index % teams]
        try:
            for number in range(warm_per_thread):
                total += one(team, number)[2]
            barrier.wait()
            for number in range(per_thread[index]):
                reserve_s, settle_s, actual = one(team, number)
                total += actual
                local.append((reserve_s, settle_s))
        except threading.BrokenBarrierError:
            pass
        except Exception as exc:  # reported, the run goes on
            with lock:
                result.errors.append(f"{type(exc).__name__}: {exc}")
            barrier.abort()
        finally:
            connection.close()
            with lock:
                settled_total[0] += total
                for reserve_s, settle_s in local:
                    result.reserve_ms.append(reserve_s * 1000)
                    result.settle_ms.append(settle_s * 1000)
                    result.samples_ms.append((reserve_s + settle_s) * 1000)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    result.wall_s = time.perf_counter() - started

    used = sum(QuotaCounter.objects.filter(limit__in=limits).values_list("used", flat=True))
    if used != settled_total[0]:
        result.checks.append(f"quota counter {used} != sum of actual {settled_total[0]}")
    ours = Reservation.objects.filter(team__in=team_list)
    unsettled = ours.filter(settled_at__isnull=True).count()
    if unsettled:
        result.checks.append(f"{unsettled} reservations unsettled")
    pending = ours.filter(remote_pending=True).count()
    if pending:
        result.checks.append(f"{pending} Redis refunds pending")
    return result


def redis_cleanup(redis_url: str, prefix: str) -> int:
    import redis

    client = redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=2)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    return len(keys)


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
    os.environ["RATE_LIMIT_KEY_PREFIX"] = prefix
    setup_django(data_dir, args.database_url)

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
