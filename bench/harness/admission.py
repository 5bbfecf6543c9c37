"""``budget_reserve`` + ``budget_settle`` from many threads at once, timed and checked
(admission_latency and gateway part 2 measure with this)."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field

LARGE = 10**15


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
