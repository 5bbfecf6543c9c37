"""Redis stopped mid-test: admission fails closed (503) or enforces from the database, by
setting; refunds that found Redis down are applied once it is back, and the counters agree
with the ledger. A private redis-server on its own port, so the suite's Redis stays up."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey
from apps.usage.budgets import (
    AdmissionUnavailable,
    budget_reserve,
    budget_settle,
    reservations_release_expired,
)
from apps.usage.limiters import buckets_and_slots, limiter
from apps.usage.models import Limit, QuotaCounter, Reservation
from tests.conftest import free_port, stop_process

pytestmark = pytest.mark.django_db(transaction=True)


class PrivateRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None


@pytest.fixture
def private_redis(settings: Any) -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    settings.RATE_LIMIT_REDIS_URL = server.url
    settings.RATE_LIMIT_REDIS_TIMEOUT = 0.2
    try:
        yield server
    finally:
        server.stop()


def test_admission_fails_closed_then_recovers(
    private_redis: PrivateRedis, team: Team, issued_key: IssuedKey, upstream: Any
) -> None:
    from tests.conftest import client_for

    limit = Limit.objects.create(
        team=team,
        daily_tokens=100_000,
        burst_tokens=5000,
        tokens_per_minute=60,
        max_concurrent_streams=4,
    )
    (bucket, _) = buckets_and_slots(limit)
    assert bucket is not None
    held = budget_reserve(team=team, api_key=None, tokens=1000)
    assert held.store == Reservation.Store.REDIS

    private_redis.stop()
    with pytest.raises(AdmissionUnavailable) as refused:
        budget_reserve(team=team, api_key=None, tokens=10)
    assert (refused.value.status, refused.value.code) == (503, "rate_limiter_unavailable")
    assert refused.value.headers["Retry-After"] == "5"
    # Redis holds the 1000 until they settle; the database records what settled, and the
    # refusal charged nothing.
    assert not QuotaCounter.objects.filter(used__gt=0).exists()

    api = client_for(issued_key.secret)
    conversation = api.post("/api/v1/conversations", {}, format="json").json()["id"]
    response = api.post(
        f"/api/v1/conversations/{conversation}/messages",
        {"content": "Hi", "top_k": 0},
        format="json",
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "rate_limiter_unavailable"
    assert response.headers["Retry-After"] == "5"
    assert upstream.requests == []

    budget_settle(reservation=held, actual=400)  # the quota refund happens; Redis's waits
    held.refresh_from_db()
    assert held.remote_pending is True and held.actual_tokens == 400
    assert QuotaCounter.objects.get().used == 400

    private_redis.start()  # back, empty (it keeps nothing on disk): a full bucket
    assert reservations_release_expired() == 0
    held.refresh_from_db()
    assert held.remote_pending is False
    assert limiter().available(bucket, held.settled_at) == 5000
    answered = api.post(
        f"/api/v1/conversations/{conversation}/messages",
        {"content": "Hi", "top_k": 0},
        format="json",
    )
    assert answered.status_code == 201, answered.content
    usage = answered.json()["usage"]
    assert QuotaCounter.objects.get().used == 400 + usage["total_tokens"]  # = the ledger
    assert not Reservation.objects.filter(settled_at__isnull=True).exists()
    assert not Reservation.objects.filter(remote_pending=True).exists()


def test_database_fallback_enforces_while_redis_is_down(
    private_redis: PrivateRedis, team: Team, settings: Any
) -> None:
    settings.RATE_LIMIT_REDIS_FALLBACK = "database"
    Limit.objects.create(team=team, burst_tokens=1000, tokens_per_minute=1)
    private_redis.stop()
    first = budget_reserve(team=team, api_key=None, tokens=800)
    assert first.store == Reservation.Store.DATABASE
    from apps.usage.budgets import RateLimited

    with pytest.raises(RateLimited):  # still enforced, from the database's bucket
        budget_reserve(team=team, api_key=None, tokens=800)
    budget_settle(reservation=first, actual=100)  # a database reservation settles there
    budget_reserve(team=team, api_key=None, tokens=800)
    private_redis.start()
    assert budget_reserve(team=team, api_key=None, tokens=800).store == Reservation.Store.REDIS
