"""Failed API key lookups are throttled per client address: past a small allowance the
address gets 429 ``rate_limited`` with an exact ``Retry-After``, before any query, while
other addresses and keys the process holds are served as before. Buckets in process on the
embedded default, in Redis when configured, and in process while Redis is unreachable."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.accounts.probes import _redis_buckets, local_probe_buckets
from apps.accounts.services import api_key_create

pytestmark = pytest.mark.django_db

PROBER, NEIGHBOUR = "203.0.113.9", "198.51.100.4"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(limiter_store: str, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Three failures at once, then one every 30 s, on a clock the test moves."""
    settings.API_KEY_FAILURE_BURST = 3
    settings.API_KEY_FAILURES_PER_MINUTE = 2
    fake = Clock()
    if limiter_store == "redis":
        buckets: Any = _redis_buckets(settings.RATE_LIMIT_REDIS_URL, settings.RATE_LIMIT_KEY_PREFIX)
    else:
        buckets = local_probe_buckets()
    monkeypatch.setattr(buckets, "clock", fake)
    return fake


def client_at(address: str, secret: str) -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def made_up(n: int) -> str:
    return f"rt_{n:012x}_not-a-secret"


def code_of(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_an_address_that_keeps_failing_is_refused_before_any_query(
    clock: Clock, team: Team, other_team: Team, settings: Any, django_assert_num_queries: Any
) -> None:
    victim = api_key_create(team=other_team, scopes=["read"])
    assert client_at(PROBER, victim.secret).get("/api/v1/collections").status_code == 200

    for n in range(2):
        assert code_of(client_at(PROBER, made_up(n)).get("/api/v1/collections")) == (
            401,
            "invalid_api_key",
        )
    # The async answer view authenticates the same way (on the pool when it needs I/O).
    asked = client_at(PROBER, made_up(2)).post(
        "/api/v1/conversations/1/messages", {"content": "hi"}, format="json"
    )
    assert code_of(asked) == (401, "invalid_api_key")

    with django_assert_num_queries(0):
        refused = client_at(PROBER, made_up(3)).get("/api/v1/collections")
    assert code_of(refused) == (429, "rate_limited")
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused["Retry-After"] == "30"
    assert code_of(client_at(PROBER, victim.secret[:-2] + "xx").get("/api/v1/keys")) == (
        429,
        "rate_limited",
    )

    # Other addresses fail and succeed as before; a key the process has seen still works
    # from the prober's address (behind one proxy, say), even once its cached copy expired.
    assert code_of(client_at(NEIGHBOUR, made_up(4)).get("/api/v1/collections")) == (
        401,
        "invalid_api_key",
    )
    assert client_at(NEIGHBOUR, victim.secret).get("/api/v1/collections").status_code == 200
    assert client_at(PROBER, victim.secret).get("/api/v1/collections").status_code == 200
    settings.API_KEY_CACHE_SECONDS = 0.0001  # its copy is stale: it is loaded again
    assert client_at(PROBER, victim.secret).get("/api/v1/collections").status_code == 200
    settings.API_KEY_CACHE_SECONDS = 5

    clock.now += 15
    assert client_at(PROBER, made_up(5)).get("/api/v1/collections")["Retry-After"] == "15"
    clock.now += 15  # one failure more, then refused again
    assert code_of(client_at(PROBER, made_up(6)).get("/api/v1/collections"))[0] == 401
    assert code_of(client_at(PROBER, made_up(7)).get("/api/v1/collections"))[0] == 429


def test_with_redis_unreachable_the_process_counts(team: Team, settings: Any) -> None:
    settings.RATE_LIMIT_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.API_KEY_FAILURE_BURST = 2
    statuses = [
        client_at(PROBER, made_up(n)).get("/api/v1/collections").status_code for n in range(3)
    ]
    assert statuses == [401, 401, 429]


def test_a_burst_of_zero_turns_the_limit_off(team: Team, settings: Any) -> None:
    settings.API_KEY_FAILURE_BURST = 0
    statuses = {
        client_at(PROBER, made_up(n)).get("/api/v1/collections").status_code for n in range(25)
    }
    assert statuses == {401}
