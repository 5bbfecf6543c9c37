"""Atomic token budgets: reserve, settle, refuse with a retry time; never overspend."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey, api_key_create
from apps.core.exceptions import InvalidRequest
from apps.usage.budgets import (
    RateLimited,
    budget_reserve,
    budget_settle,
    reservations_release_expired,
)
from apps.usage.models import Limit, QuotaCounter, Reservation, TokenBucket

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.django_db
def test_burst_then_sustained_with_the_announced_retry(team: Team) -> None:
    Limit.objects.create(team=team, burst_tokens=2000, tokens_per_minute=1000)
    budget_reserve(team=team, api_key=None, tokens=2000, now=T0)  # the whole burst
    with pytest.raises(RateLimited) as refused:
        budget_reserve(team=team, api_key=None, tokens=1000, now=T0)
    error = refused.value
    assert (error.status, error.code) == (429, "team_tokens_per_minute")
    assert error.headers["Retry-After"] == "60"
    assert error.headers["x-ratelimit-remaining-tokens"] == "0"
    assert error.headers["x-ratelimit-limit-tokens"] == "2000"
    with pytest.raises(RateLimited):  # one second early is still too early
        budget_reserve(team=team, api_key=None, tokens=1000, now=T0 + timedelta(seconds=59))
    budget_reserve(team=team, api_key=None, tokens=1000, now=T0 + timedelta(seconds=60))
    assert TokenBucket.objects.get().level == 0
    with pytest.raises(InvalidRequest):  # can never fit: not a rate limit
        budget_reserve(team=team, api_key=None, tokens=2001, now=T0 + timedelta(hours=1))


@pytest.mark.django_db
def test_daily_quota_in_the_team_time_zone_with_refund_on_settle(team: Team) -> None:
    team.time_zone = "Asia/Tokyo"  # UTC+9: the day turns at 15:00 UTC
    team.save()
    Limit.objects.create(team=team, daily_tokens=10_000)
    reservations = [budget_reserve(team=team, api_key=None, tokens=1000, now=T0) for _ in range(10)]
    with pytest.raises(RateLimited) as refused:
        budget_reserve(team=team, api_key=None, tokens=1, now=T0)
    assert refused.value.code == "team_quota_exceeded"
    assert refused.value.headers["Retry-After"] == str(3 * 3600)  # to 00:00 Tokyo
    budget_settle(reservation=reservations[0], actual=400)  # 600 refunded
    budget_settle(reservation=reservations[0], actual=400)  # settling twice changes nothing
    assert QuotaCounter.objects.get().used == 9400
    budget_reserve(team=team, api_key=None, tokens=600, now=T0)
    with pytest.raises(RateLimited):
        budget_reserve(team=team, api_key=None, tokens=1, now=T0)
    budget_reserve(team=team, api_key=None, tokens=1, now=T0 + timedelta(hours=3))


@pytest.mark.django_db
def test_all_or_nothing_across_team_and_key_limits(team: Team) -> None:
    key = api_key_create(team=team).api_key
    Limit.objects.create(team=team, daily_tokens=10_000)
    Limit.objects.create(team=team, api_key=key, burst_tokens=500, tokens_per_minute=500)
    budget_reserve(team=team, api_key=key, tokens=500, now=T0)
    with pytest.raises(RateLimited) as refused:
        budget_reserve(team=team, api_key=key, tokens=100, now=T0)
    assert refused.value.code == "key_tokens_per_minute"
    assert QuotaCounter.objects.get().used == 500  # the refused request charged nothing
    other = api_key_create(team=team).api_key  # another key of the team is not throttled
    budget_reserve(team=team, api_key=other, tokens=100, now=T0)


@pytest.mark.django_db
def test_expired_reservations_are_released(team: Team) -> None:
    Limit.objects.create(team=team, daily_tokens=1000)
    budget_reserve(team=team, api_key=None, tokens=1000, now=T0)
    assert reservations_release_expired(now=T0 + timedelta(minutes=1)) == 0
    assert reservations_release_expired(now=T0 + timedelta(days=1)) == 1
    assert QuotaCounter.objects.get().used == 0
    assert Reservation.objects.get().settled_at is not None


@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_never_overspend(team: Team) -> None:
    Limit.objects.create(team=team, daily_tokens=10_000, burst_tokens=20_000, tokens_per_minute=1)
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
    assert QuotaCounter.objects.get().used == 10_000
    assert TokenBucket.objects.get().level == 10_000
    assert Reservation.objects.count() == 10


@pytest.mark.django_db(transaction=True)
def test_refused_answer_is_a_429_and_calls_nothing(
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
            json={"content": "Hi", "top_k": 0, "stream": True, "max_tokens": 100},
            headers=headers,
        )
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "team_quota_exceeded"
    assert int(response.headers["retry-after"]) > 0
    assert response.headers["x-ratelimit-limit-tokens"] == "50"
    assert upstream.requests == []


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
        stdout=out,
    )
    assert "daily = 10000" in out.getvalue() and "monthly = unlimited" in out.getvalue()
    budget_reserve(team=team, api_key=issued_key.api_key, tokens=1500)
    quota = api.get("/api/v1/quota").json()
    (team_limits,) = quota["limits"]
    assert team_limits["scope"] == "team" and quota["unlimited"] is False
    assert team_limits["day"]["used"] == 1500 and team_limits["day"]["remaining"] == 8500
    assert team_limits["bucket"]["capacity"] == 2000
    assert 500 <= team_limits["bucket"]["available"] < 2000
    call_command("setlimits", "--team", team.name, "--daily", "none", stdout=StringIO())
    assert Limit.objects.get().daily_tokens is None
    out = StringIO()
    call_command("setlimits", "--team", team.name, "--key", issued_key.api_key.prefix, stdout=out)
    assert out.getvalue().strip() == f"key {issued_key.api_key.prefix}: unlimited"
