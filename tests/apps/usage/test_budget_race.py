"""The budget race through two real ASGI worker processes sharing one database (and one
Redis, when configured): 32 streaming answers at once against a 10,000-token daily budget.

Each answer reserves its prompt plus 1000 output tokens, and the fake tier emits exactly
1000, so about nine fit. Whatever the interleaving: every response is a whole stream or a
429 with a retry time, the ledger never passes the budget, only admitted requests reach
the tier, and once the streams end nothing is held and the day's counter is the ledger.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey
from apps.usage.limiters import buckets_and_slots, limiter
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord
from config.env import BASE_DIR
from tests.apps.chat.conftest import parse_sse
from tests.conftest import free_port, stop_process

DAILY = 10_000
MAX_TOKENS = 1000
REQUESTS_PER_WORKER = 16


def database_url() -> str:
    """This test's database, as the worker processes must reach it."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    password = f":{db['PASSWORD']}" if db["PASSWORD"] else ""
    return f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def workers(upstream: Any, tmp_path: Path) -> Iterator[list[str]]:
    """Two uvicorn processes serving the app, both started and answering /healthz."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": database_url(),
        "RAGTIER_TEST_DATA_DIR": str(tmp_path),
        "INFERENCE_BASE_URL": upstream.base_url,
        "TOKENIZER_BACKEND": "inference.tokenizers.FakeTokenizer",
        "EMBEDDER_BACKEND": "retrieval.embedders.FakeEmbedder",
        "RATE_LIMIT_REDIS_URL": settings.RATE_LIMIT_REDIS_URL,
        "RATE_LIMIT_KEY_PREFIX": settings.RATE_LIMIT_KEY_PREFIX,
        # A fixed context window (no call to the tier's /models) and room for 1000 tokens.
        "MODEL_SMALL_CONTEXT_WINDOW": "8192",
        "MODEL_SMALL_MAX_OUTPUT_TOKENS": str(MAX_TOKENS),
    }
    processes: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
    urls: list[str] = []
    try:
        for log in logs:
            port = free_port()
            with log.open("wb") as out:
                processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "uvicorn",
                            "config.asgi:application",
                            "--port",
                            str(port),
                            "--log-level",
                            "warning",
                        ],
                        cwd=BASE_DIR,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
            urls.append(f"http://127.0.0.1:{port}")
        for process, url, log in zip(processes, urls, logs, strict=True):
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None:
                    pytest.fail(f"a worker exited at start-up:\n{log.read_text()}")
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"a worker did not answer /healthz in 60 s:\n{log.read_text()}")
                time.sleep(0.2)
        yield urls
    finally:
        for process in processes:
            stop_process(process)
        for log in logs:
            if log.exists() and log.read_text().strip():
                print(f"--- {log.name}\n{log.read_text()}")


@pytest.mark.django_db(transaction=True)
def test_two_workers_never_overspend_the_daily_budget(
    upstream: Any, team: Team, issued_key: IssuedKey, workers: list[str]
) -> None:
    limit = Limit.objects.create(
        team=team, daily_tokens=DAILY, burst_tokens=DAILY, tokens_per_minute=1
    )
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
