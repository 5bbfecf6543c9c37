"""The budget race through two real ASGI worker processes sharing one database (and, in
the second run, one Redis that counts the quotas): 32 streaming answers at once against a
10,000-token daily budget.

Each answer reserves its prompt plus 1000 output tokens, and the fake tier emits exactly
1000, so about nine fit. Whatever the interleaving: every response is a whole stream or a
429 with a retry time, the ledger never passes the budget, only admitted requests reach
the tier, and once the streams end nothing is held and the day's counter is the ledger.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey
from apps.usage.limiters import buckets_and_slots, limiter
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord
from apps.usage.values import nanos_of
from tests.apps.chat.conftest import parse_sse

DAILY = 10_000
MAX_TOKENS = 1000
REQUESTS_PER_WORKER = 16


@pytest.fixture
def workers(asgi_workers: Callable[..., list[str]], limiter_store: str) -> list[str]:
    return asgi_workers(
        count=2,
        RATE_LIMIT_REDIS_URL=settings.RATE_LIMIT_REDIS_URL,
        RATE_LIMIT_KEY_PREFIX=settings.RATE_LIMIT_KEY_PREFIX,
        # Room for 1000 output tokens.
        MODEL_SMALL_MAX_OUTPUT_TOKENS=str(MAX_TOKENS),
    )


@pytest.mark.django_db(transaction=True)
def test_two_workers_never_overspend_the_daily_budget(
    upstream: Any, team: Team, issued_key: IssuedKey, workers: list[str]
) -> None:
    limit = Limit.objects.create(
        team=team, daily_tokens=DAILY, burst_tokens=DAILY, tokens_per_minute=1
    )
    outcomes = _race(upstream, issued_key, workers)
    admitted = 0
    for status, outcome in outcomes:
        if status == 200:
            admitted += 1
            assert outcome["content_type"].startswith("text/event-stream")
            events = outcome["events"]
            assert events and events[-1]["event"] == "done", events[-3:]
            assert not [e for e in events if e.get("event") == "error"], events[-3:]
        else:
            assert status == 429, outcome
            assert int(outcome["headers"]["retry-after"]) > 0
            code = outcome["json"]["error"]["code"]
            assert code in ("team_quota_exceeded", "team_tokens_per_minute"), outcome

    ledger = UsageRecord.objects.filter(team=team, kind=UsageRecord.Kind.CHAT)
    charged = ledger.aggregate(total=Sum("prompt_tokens") + Sum("completion_tokens"))["total"]
    assert admitted >= 1
    assert ledger.count() == admitted
    assert charged <= DAILY, f"overspent by {charged - DAILY}"
    assert len(upstream.requests) == admitted
    assert all(r["max_tokens"] == MAX_TOKENS for r in upstream.requests)
    assert not Reservation.objects.filter(team=team, settled_at__isnull=True).exists()
    assert Reservation.objects.filter(team=team).count() == admitted  # refusals left none
    assert QuotaCounter.objects.get(limit=limit, period="day").used == charged
    bucket, _ = buckets_and_slots(limit)
    assert bucket is not None
    # The bucket refills 1 token a minute: it lacks what was charged, give or take that.
    level = limiter().available(bucket, timezone.now())
    assert DAILY - charged <= level <= DAILY - charged + 5


def _race(upstream: Any, issued_key: IssuedKey, workers: list[str]) -> list[tuple[int, Any]]:
    """32 streaming answers at once, half through each worker: each one's status and
    headers, and its events or error body."""
    upstream.script.emit_max_tokens = True
    upstream.script.delay = 0.002  # streams overlap: admissions race settlements
    headers = {"Authorization": f"Bearer {issued_key.secret}"}
    created = httpx.post(f"{workers[0]}/api/v1/conversations", json={}, headers=headers)
    assert created.status_code == 201, created.text
    path = f"/api/v1/conversations/{created.json()['id']}/messages"
    body = {"content": "How many tokens are left?", "stream": True, "max_tokens": MAX_TOKENS}
    barrier = threading.Barrier(2 * REQUESTS_PER_WORKER)
    outcomes: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()

    def ask(url: str) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            barrier.wait(timeout=60)
            try:
                with client.stream(
                    "POST",
                    path,
                    json={**body, "top_k": 0},
                    headers={"Accept": "text/event-stream"},
                ) as response:
                    outcome: dict[str, Any] = {"headers": dict(response.headers)}
                    if response.status_code == 200:
                        outcome["content_type"] = response.headers["content-type"]
                        outcome["events"] = [
                            f for f in parse_sse(response.iter_lines()) if "comment" not in f
                        ]
                    else:
                        response.read()
                        outcome["json"] = response.json()
                    result = (response.status_code, outcome)
            except Exception as exc:  # reported below, with the others
                result = (0, {"error": repr(exc)})
        with lock:
            outcomes.append(result)

    threads = [
        threading.Thread(target=ask, args=(url,))
        for url in workers
        for _ in range(REQUESTS_PER_WORKER)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(outcomes) == 2 * REQUESTS_PER_WORKER, "a request did not finish"

    return outcomes


# USD per million tokens: an answer (its prompt and 1000 output tokens) costs about $0.006.
PRICES = {
    "small": {"input": 2.0, "cached_input": 1.0, "output": 6.0},
    "large": {"input": 2.0, "cached_input": 1.0, "output": 6.0},
}
DAILY_USD = Decimal("0.05")


@pytest.fixture
def priced_workers(asgi_workers: Callable[..., list[str]], limiter_store: str) -> list[str]:
    return asgi_workers(
        count=2,
        RATE_LIMIT_REDIS_URL=settings.RATE_LIMIT_REDIS_URL,
        RATE_LIMIT_KEY_PREFIX=settings.RATE_LIMIT_KEY_PREFIX,
        MODEL_SMALL_MAX_OUTPUT_TOKENS=str(MAX_TOKENS),
        MODEL_PRICES=json.dumps(PRICES),
    )


@pytest.mark.django_db(transaction=True)
def test_two_workers_never_overspend_the_daily_money_budget(
    upstream: Any, team: Team, issued_key: IssuedKey, priced_workers: list[str]
) -> None:
    """The same race against $0.05 a day: each answer holds its prompt and 1000 output
    tokens at the served alias's prices; about eight fit. The ledger's cost never passes
    the budget and the day's money counter is the ledger's, in nano-dollars."""
    limit = Limit.objects.create(team=team, daily_usd=DAILY_USD)
    outcomes = _race(upstream, issued_key, priced_workers)
    refused = [outcome for status, outcome in outcomes if status != 200]
    for outcome in refused:
        assert outcome["json"]["error"]["code"] == "budget_exceeded", outcome
        assert int(outcome["headers"]["retry-after"]) > 0
        assert Decimal(outcome["headers"]["x-ratelimit-limit-usd"]) == DAILY_USD
    done = [outcome for status, outcome in outcomes if status == 200]
    for outcome in done:
        events = outcome["events"]
        assert events[-1]["event"] == "done", events[-3:]
    ledger = UsageRecord.objects.filter(team=team, kind=UsageRecord.Kind.CHAT)
    spent = ledger.aggregate(total=Sum("cost_usd"))["total"]
    assert 1 <= len(done) < len(outcomes), "the budget admitted some and refused the rest"
    assert ledger.count() == len(done) == len(upstream.requests)
    assert spent <= DAILY_USD, f"overspent by {spent - DAILY_USD}"
    assert spent > DAILY_USD - Decimal("0.0125"), "less than two answers' worth left unspent"
    assert not Reservation.objects.filter(team=team, settled_at__isnull=True).exists()
    counter = QuotaCounter.objects.get(limit=limit, period="day", unit="usd")
    assert counter.used == sum(nanos_of(row.cost_usd) for row in ledger)
