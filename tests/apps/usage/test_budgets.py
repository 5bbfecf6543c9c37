"""Atomic token budgets: reserve, extend, settle, refuse with a retry time; never overspend.

Tests taking ``limiter_store`` run twice: every limit in the database, then in real Redis
(its Lua scripts: quotas, buckets and slots there, the database keeping the record of what
settled).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey, api_key_create
from apps.core.exceptions import InvalidRequest
from apps.usage.budgets import (
    RateLimited,
    budget_extend,
    budget_reserve,
    budget_settle,
    quota_used,
    reservations_release_expired,
)
from apps.usage.limiters import QuotaKey, buckets_and_slots, limiter
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def available(limit: Limit, now: datetime) -> int:
    """Tokens in ``limit``'s bucket at ``now``, in whichever store holds it."""
    bucket, _ = buckets_and_slots(limit)
    assert bucket is not None
    return limiter().available(bucket, now)


def counted(limit: Limit, now: datetime = T0) -> int:
    """What ``limit``'s daily quota counts (settled plus held), in whichever store."""
    return quota_used(key=QuotaKey(limit.pk, "day", now.date()), now=now)


@pytest.fixture
def committed(django_capture_on_commit_callbacks: Any) -> Callable[[], Any]:
    """Run what waits for commit (Redis refunds) inside the test's transaction."""

    @contextmanager
    def run() -> Iterator[None]:
        with django_capture_on_commit_callbacks(execute=True):
            yield

    return run


@pytest.mark.django_db
def test_burst_then_sustained_with_the_announced_retry(team: Team, limiter_store: str) -> None:
    limit = Limit.objects.create(team=team, burst_tokens=2000, tokens_per_minute=1000)
    budget_reserve(team=team, api_key=None, tokens=2000, now=T0)  # the whole burst
    with pytest.raises(RateLimited) as refused:
        budget_reserve(team=team, api_key=None, tokens=1000, now=T0)
    error = refused.value
    assert (error.status, error.code) == (429, "team_tokens_per_minute")
    assert error.headers["Retry-After"] == "60"
    assert error.headers["x-ratelimit-remaining-tokens"] == "0"
    assert error.headers["x-ratelimit-limit-tokens"] == "2000"
    assert error.headers["x-ratelimit-reset-tokens"] == "60s"
    with pytest.raises(RateLimited):  # one second early is still too early
        budget_reserve(team=team, api_key=None, tokens=1000, now=T0 + timedelta(seconds=59))
    budget_reserve(team=team, api_key=None, tokens=1000, now=T0 + timedelta(seconds=60))
    assert available(limit, T0 + timedelta(seconds=60)) == 0
    assert available(limit, T0 + timedelta(seconds=90)) == 500
    with pytest.raises(InvalidRequest):  # can never fit: not a rate limit
        budget_reserve(team=team, api_key=None, tokens=2001, now=T0 + timedelta(hours=1))
    assert Reservation.objects.filter(store=limiter_store).count() == 2


@pytest.mark.django_db
def test_daily_quota_in_the_team_time_zone_with_refund_on_settle(team: Team) -> None:
    team.time_zone = "Asia/Tokyo"  # UTC+9: the day turns at 15:00 UTC
    team.save()
    limit = Limit.objects.create(team=team, daily_tokens=10_000)
    reservations = [budget_reserve(team=team, api_key=None, tokens=1000, now=T0) for _ in range(10)]
    with pytest.raises(RateLimited) as refused:
        budget_reserve(team=team, api_key=None, tokens=1, now=T0)
    assert refused.value.code == "team_quota_exceeded"
    assert refused.value.headers["Retry-After"] == str(3 * 3600)  # to 00:00 Tokyo
    budget_settle(reservation=reservations[0], actual=400)  # 600 refunded
    budget_settle(reservation=reservations[0], actual=400)  # settling twice changes nothing
    assert counted(limit) == 9400
    budget_reserve(team=team, api_key=None, tokens=600, now=T0)
    with pytest.raises(RateLimited):
        budget_reserve(team=team, api_key=None, tokens=1, now=T0)
    budget_reserve(team=team, api_key=None, tokens=1, now=T0 + timedelta(hours=3))


@pytest.mark.django_db
def test_the_database_store_counts_alike_whether_queries_are_logged_or_not(
    team: Team, settings: Any
) -> None:
    """Its statements run on the driver's cursor, or on the ORM's where queries are logged
    (``DEBUG``, a test counting them), so that they are seen there: the same effect."""
    settings.RATE_LIMIT_REDIS_URL = ""  # the database store, even where Redis is configured
    limit = Limit.objects.create(
        team=team,
        daily_tokens=10_000,
        burst_tokens=5000,
        tokens_per_minute=600,
        max_concurrent_streams=4,
    )
    quiet = budget_reserve(team=team, api_key=None, tokens=1000, now=T0)
    with CaptureQueriesContext(connection) as queries:
        logged = budget_reserve(team=team, api_key=None, tokens=1000, now=T0)
    counters = QuotaCounter._meta.db_table
    assert any(counters in query["sql"] for query in queries.captured_queries)
    assert counted(limit) == 2000 and available(limit, T0) == 3000
    budget_settle(reservation=quiet, actual=250)
    with CaptureQueriesContext(connection):
        budget_settle(reservation=logged, actual=250)
    assert counted(limit) == 500 and available(limit, T0) == 4500


@pytest.mark.django_db
def test_all_or_nothing_across_team_and_key_limits(team: Team, limiter_store: str) -> None:
    key = api_key_create(team=team).api_key
    team_limit = Limit.objects.create(team=team, daily_tokens=10_000)
    key_limit = Limit.objects.create(
        team=team, api_key=key, burst_tokens=500, tokens_per_minute=500
    )
    budget_reserve(team=team, api_key=key, tokens=500, now=T0)
    with pytest.raises(RateLimited) as refused:
        budget_reserve(team=team, api_key=key, tokens=100, now=T0)
    assert refused.value.code == "key_tokens_per_minute"
    assert counted(team_limit) == 500  # the refused request charged nothing
    assert available(key_limit, T0) == 0
    other = api_key_create(team=team).api_key  # another key of the team is not throttled
    budget_reserve(team=team, api_key=other, tokens=100, now=T0)


@pytest.mark.django_db
def test_a_full_quota_refuses_before_the_bucket_is_drawn(team: Team, limiter_store: str) -> None:
    limit = Limit.objects.create(
        team=team, daily_tokens=1000, burst_tokens=5000, tokens_per_minute=10
    )
    budget_reserve(team=team, api_key=None, tokens=1000, now=T0)
    with pytest.raises(RateLimited) as refused:
        budget_reserve(team=team, api_key=None, tokens=10, now=T0)
    assert refused.value.code == "team_quota_exceeded"
    assert available(limit, T0) == 4000  # the refusal took nothing from the bucket


@pytest.mark.django_db
def test_concurrent_streams_per_key(
    team: Team, limiter_store: str, committed: Callable[[], Any]
) -> None:
    key = api_key_create(team=team).api_key
    Limit.objects.create(team=team, api_key=key, max_concurrent_streams=2)
    first = budget_reserve(team=team, api_key=key, tokens=10, now=T0)
    budget_reserve(team=team, api_key=key, tokens=10, now=T0)
    with pytest.raises(RateLimited) as refused:
        budget_reserve(team=team, api_key=key, tokens=10, now=T0)
    assert refused.value.code == "too_many_concurrent_streams"
    assert refused.value.headers["Retry-After"] == "1"
    assert refused.value.headers["x-ratelimit-limit-streams"] == "2"
    budget_reserve(team=team, api_key=None, tokens=10, now=T0)  # the team itself has no cap
    embedding = budget_reserve(team=team, api_key=key, tokens=10, kind="embedding", now=T0)
    assert embedding.slots == []  # ingestion holds no stream slot
    with committed():
        budget_settle(reservation=first, actual=5, now=T0)
    budget_reserve(team=team, api_key=key, tokens=10, now=T0)
    with pytest.raises(RateLimited):
        budget_reserve(team=team, api_key=key, tokens=10, now=T0)


@pytest.mark.django_db
def test_extend_is_all_or_nothing_and_settles_as_one(
    team: Team, limiter_store: str, committed: Callable[[], Any]
) -> None:
    limit = Limit.objects.create(
        team=team, daily_tokens=2000, burst_tokens=1000, tokens_per_minute=1
    )
    reservation = budget_reserve(team=team, api_key=None, tokens=600, now=T0)
    with pytest.raises(RateLimited) as refused:
        budget_extend(reservation=reservation, tokens=500, now=T0)
    assert refused.value.code == "team_tokens_per_minute"
    assert counted(limit) == 600  # unchanged by the refusal
    assert Reservation.objects.get().tokens == 600
    budget_extend(reservation=reservation, tokens=400, now=T0)
    assert counted(limit) == 1000
    assert available(limit, T0) == 0
    with committed():
        budget_settle(reservation=reservation, actual=700, now=T0)
    assert QuotaCounter.objects.get().used == counted(limit) == 700
    assert available(limit, T0) == 300
    assert Reservation.objects.get().remote_pending is False


@pytest.mark.django_db
def test_an_expired_reservation_cannot_grow_past_the_quota(
    team: Team, limiter_store: str, committed: Callable[[], Any]
) -> None:
    # Found by the budget state machine on Redis: past its expiry a reservation's hold is
    # gone there, so an extension fitted what was left, and settling the whole
    # reservation then charged the day past its quota (5110 of 5000).
    limit = Limit.objects.create(team=team, daily_tokens=5000)
    reservation = budget_reserve(team=team, api_key=None, tokens=2500, now=T0)
    later = reservation.expires_at + timedelta(minutes=1)
    with pytest.raises(InvalidRequest, match="expired"):
        budget_extend(reservation=reservation, tokens=2600, now=later)
    assert Reservation.objects.get().tokens == reservation.tokens == 2500
    with committed():
        budget_settle(reservation=reservation, actual=2500, now=later)
    assert counted(limit) == 2500


@pytest.mark.django_db
def test_expired_reservations_are_released(
    team: Team, limiter_store: str, committed: Callable[[], Any]
) -> None:
    key = api_key_create(team=team).api_key
    Limit.objects.create(team=team, daily_tokens=1000)
    limit = Limit.objects.create(
        team=team, api_key=key, burst_tokens=1000, tokens_per_minute=1, max_concurrent_streams=1
    )
    budget_reserve(team=team, api_key=key, tokens=1000, now=T0)
    assert reservations_release_expired(now=T0 + timedelta(minutes=1)) == 0
    with committed():
        assert reservations_release_expired(now=T0 + timedelta(days=1)) == 1
    assert QuotaCounter.objects.get().used == 0
    assert Reservation.objects.get().settled_at is not None
    later = T0 + timedelta(days=1)
    assert available(limit, later) == 1000
    budget_reserve(team=team, api_key=key, tokens=10, now=later)  # its slot is free again


@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_never_overspend(team: Team, limiter_store: str) -> None:
    limit = Limit.objects.create(
        team=team, daily_tokens=10_000, burst_tokens=20_000, tokens_per_minute=1
    )
    barrier = threading.Barrier(32)
    outcomes: list[str] = []
    lock = threading.Lock()

    def request() -> None:
        barrier.wait()
        try:
            budget_reserve(team=team, api_key=None, tokens=1000)
            result = "admitted"
        except RateLimited as exc:
            assert exc.headers["Retry-After"]
            result = "refused"
        except Exception as exc:
            result = f"error {exc!r}"
        finally:
            connection.close()
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=request) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(set(outcomes)) == ["admitted", "refused"], outcomes
    assert outcomes.count("admitted") == 10
    assert counted(limit, datetime.now(UTC)) == 10_000
    assert 10_000 <= available(limit, datetime.now(UTC)) <= 10_001
    assert Reservation.objects.count() == 10


@pytest.mark.django_db(transaction=True)
def test_refused_answer_is_a_429_that_embeds_and_calls_nothing(
    upstream: Any, team: Team, issued_key: IssuedKey
) -> None:
    import httpx

    from tests.fake_upstream import ServerThread

    Limit.objects.create(team=team, daily_tokens=50)
    from config.asgi import application

    with ServerThread(application) as url:
        headers = {"Authorization": f"Bearer {issued_key.secret}"}
        conversation = httpx.post(f"{url}/api/v1/conversations", json={}, headers=headers).json()
        response = httpx.post(
            f"{url}/api/v1/conversations/{conversation['id']}/messages",
            json={"content": "Hi", "stream": True, "max_tokens": 100},
            headers=headers,
        )
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "team_quota_exceeded"
    assert int(response.headers["retry-after"]) > 0
    assert response.headers["x-ratelimit-limit-tokens"] == "50"
    assert upstream.requests == []
    assert not UsageRecord.objects.exists()  # the query was not even embedded
    assert not QuotaCounter.objects.filter(used__gt=0).exists()


@pytest.mark.django_db(transaction=True)  # the answer view reads on its own thread pool
def test_max_tokens_cap_of_a_limit(
    upstream: Any, team: Team, issued_key: IssuedKey, api: Any
) -> None:
    Limit.objects.create(team=team, api_key=issued_key.api_key, max_tokens=40)
    conversation = api.post("/api/v1/conversations", {}, format="json").json()["id"]
    path = f"/api/v1/conversations/{conversation}/messages"
    response = api.post(path, {"content": "Hi", "max_tokens": 41, "top_k": 0}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "max_tokens_too_large"
    assert response.json()["error"]["param"] == "max_tokens"
    assert upstream.requests == []
    answered = api.post(path, {"content": "Hi", "top_k": 0}, format="json")
    assert answered.status_code == 201, answered.content
    assert upstream.requests[0]["max_tokens"] == 40  # the cap is the default


@pytest.mark.django_db
def test_setlimits_and_the_quota_endpoint(team: Team, issued_key: IssuedKey) -> None:
    from io import StringIO

    from django.core.management import call_command

    from tests.conftest import client_for

    api = client_for(issued_key.secret)
    assert api.get("/api/v1/quota").json() == {"limits": [], "unlimited": True}
    out = StringIO()
    call_command(
        "setlimits",
        "--team",
        team.name,
        "--daily",
        "10000",
        "--burst",
        "2000",
        "--tokens-per-minute",
        "1000",
        "--max-concurrent",
        "3",
        "--max-tokens",
        "256",
        stdout=out,
    )
    printed = out.getvalue()
    assert "daily = 10000" in printed and "monthly = unlimited" in printed
    assert "max_concurrent = 3" in printed and "max_tokens = 256" in printed
    budget_reserve(team=team, api_key=issued_key.api_key, tokens=1500)
    quota = api.get("/api/v1/quota").json()
    (team_limits,) = quota["limits"]
    assert team_limits["scope"] == "team" and quota["unlimited"] is False
    assert team_limits["day"]["used"] == 1500 and team_limits["day"]["remaining"] == 8500
    assert team_limits["bucket"]["capacity"] == 2000
    assert 500 <= team_limits["bucket"]["available"] < 2000
    assert team_limits["max_concurrent_streams"] == 3 and team_limits["max_tokens"] == 256
    call_command("setlimits", "--team", team.name, "--daily", "none", stdout=StringIO())
    assert Limit.objects.get().daily_tokens is None
    out = StringIO()
    call_command("setlimits", "--team", team.name, "--key", issued_key.api_key.prefix, stdout=out)
    assert out.getvalue().strip() == f"key {issued_key.api_key.prefix}: unlimited"


@pytest.mark.django_db
def test_metrics_count_refusals_by_code_and_show_open_reservations(team: Team, client: Any) -> None:
    from prometheus_client import REGISTRY

    def refused(code: str) -> float:
        value = REGISTRY.get_sample_value("ragtier_rate_limited_total", {"code": code})
        return value or 0.0

    Limit.objects.create(team=team, daily_tokens=1000)
    before = refused("team_quota_exceeded")
    budget_reserve(team=team, api_key=None, tokens=900, now=T0)
    with pytest.raises(RateLimited):
        budget_reserve(team=team, api_key=None, tokens=200, now=T0)
    assert refused("team_quota_exceeded") == before + 1
    body = client.get("/metrics").content.decode()
    assert 'ragtier_reservations_open{kind="chat"} 1.0' in body
    assert 'ragtier_reserved_tokens{kind="chat"} 900.0' in body
    assert 'ragtier_reservations_open{kind="embedding"} 0.0' in body
