"""Admission with Redis: one Lua call covers the quotas, buckets and slots; the reservation
row is written later (or by settling), exactly once; a quota missing from Redis is seeded
from the database; the periodic job reconciles Redis with the database record."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction

from apps.accounts.models import Team
from apps.accounts.services import api_key_create
from apps.usage.budgets import (
    RateLimited,
    budget_extend,
    budget_reserve,
    budget_settle,
    quota_name,
    quota_used,
    reservation_record,
    reservations_release_expired,
)
from apps.usage.limiters import QuotaKey, RedisLimiter, limiter
from apps.usage.models import Limit, QuotaCounter, Reservation
from tests.conftest import reachable_redis_url

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _redis(settings: Any) -> None:
    settings.RATE_LIMIT_REDIS_URL = reachable_redis_url()


def redis_store() -> RedisLimiter:
    store = limiter()
    assert isinstance(store, RedisLimiter)
    return store


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the Redis commands the limiter sends, in order."""
    client = redis_store().client
    sent: list[str] = []
    send = client.execute_command

    def counted(*args: Any, **options: Any) -> Any:
        sent.append(str(args[0]))
        return send(*args, **options)

    monkeypatch.setattr(client, "execute_command", counted)
    yield sent


def day(limit: Limit, now: datetime = T0) -> QuotaKey:
    return QuotaKey(limit.pk, "day", now.date())


@pytest.mark.django_db(transaction=True)  # no enclosing transaction: the row may wait
def test_one_lua_call_and_no_database_round_trip_per_reservation(
    team: Team, commands: list[str], django_assert_num_queries: Any
) -> None:
    key = api_key_create(team=team).api_key
    team_limit = Limit.objects.create(
        team=team, daily_tokens=100_000, monthly_tokens=1_000_000, max_concurrent_streams=8
    )
    Limit.objects.create(
        team=team, api_key=key, daily_tokens=50_000, burst_tokens=5000, tokens_per_minute=600
    )
    limits = list(Limit.objects.filter(team=team))
    # The period's first request seeds the three quotas from the database (and takes a
    # block of reservation keys); Redis learns the scripts.
    first = budget_reserve(
        team=team, api_key=key, tokens=100, limits=limits, defer_record=True, now=T0
    )
    budget_settle(reservation=first, actual=100, now=T0)
    commands.clear()
    with django_assert_num_queries(0):
        reservation = budget_reserve(
            team=team, api_key=key, tokens=300, limits=limits, defer_record=True, now=T0
        )
    assert commands == ["EVALSHA"]
    assert not Reservation.objects.filter(pk=reservation.pk).exists()  # not written yet
    assert quota_used(key=day(team_limit), now=T0) == 400

    commands.clear()
    budget_settle(reservation=reservation, actual=120, now=T0)  # writes the row first
    assert commands == ["EVALSHA"]  # the refund: bucket, slot and quotas at once
    written = Reservation.objects.get(pk=reservation.pk)
    assert (written.tokens, written.actual_tokens, written.remote_pending) == (300, 120, False)
    assert written.settled_at is not None
    assert QuotaCounter.objects.get(limit=team_limit, period="day").used == 220
    assert quota_used(key=day(team_limit), now=T0) == 220  # what settled, nothing held

    commands.clear()
    budget_reserve(team=team, api_key=key, tokens=300, limits=limits, now=T0)  # written now
    assert commands == ["EVALSHA"]


@pytest.mark.django_db(transaction=True)
def test_a_deferred_reservation_is_written_and_settled_exactly_once(team: Team) -> None:
    limit = Limit.objects.create(team=team, daily_tokens=10_000, max_concurrent_streams=2)
    extended = budget_reserve(team=team, api_key=None, tokens=1000, defer_record=True, now=T0)
    budget_extend(reservation=extended, tokens=500, now=T0)  # before the row is written
    reservation_record(reservation=extended)
    reservation_record(reservation=extended)  # once only
    assert Reservation.objects.get(pk=extended.pk).tokens == 1500
    budget_extend(reservation=extended, tokens=100, now=T0)  # after
    assert Reservation.objects.get(pk=extended.pk).tokens == 1600
    assert quota_used(key=day(limit), now=T0) == 1600

    settled_first = budget_reserve(team=team, api_key=None, tokens=2000, defer_record=True, now=T0)
    with pytest.raises(RuntimeError), transaction.atomic():  # the caller's transaction fails
        budget_settle(reservation=settled_first, actual=700, now=T0)
        raise RuntimeError
    assert not Reservation.objects.filter(pk=settled_first.pk).exists()
    budget_settle(reservation=settled_first, actual=700, now=T0)  # its retry
    budget_settle(reservation=settled_first, actual=700, now=T0)  # a second settle: nothing
    reservation_record(reservation=settled_first)  # written already: nothing
    budget_settle(reservation=extended, actual=1600, now=T0)

    rows = Reservation.objects.filter(team=team)
    assert sorted(rows.values_list("actual_tokens", flat=True)) == [700, 1600]
    assert not rows.filter(settled_at__isnull=True).exists()
    assert QuotaCounter.objects.get(limit=limit).used == 2300
    # The failed settle's Redis refund ran inside the rolled-back transaction; its retry
    # was not applied twice. The periodic job keeps Redis on the record.
    assert quota_used(key=day(limit), now=T0) == 2300
    reservations_release_expired(now=T0)
    assert quota_used(key=day(limit), now=T0) == 2300
    budget_reserve(team=team, api_key=None, tokens=10, now=T0)
    budget_reserve(team=team, api_key=None, tokens=10, now=T0)  # both slots were freed


@pytest.mark.django_db(transaction=True)
def test_a_fresh_period_is_seeded_from_the_database(team: Team) -> None:
    limit = Limit.objects.create(team=team, daily_tokens=10_000)
    QuotaCounter.objects.create(limit=limit, period="day", starts_on=T0.date(), used=9000)
    # A reservation another process holds (its row written, its Redis state lost).
    other = Reservation.objects.create(
        team=team,
        tokens=500,
        store=Reservation.Store.REDIS,
        counters=[quota_name(day(limit))],
        created_at=T0,
        expires_at=T0 + timedelta(hours=1),
    )
    assert redis_store().quota_used(day(limit), T0) is None  # nothing in Redis
    budget_reserve(team=team, api_key=None, tokens=500, now=T0)
    assert quota_used(key=day(limit), now=T0) == 10_000  # 9000 settled + 500 + 500 held
    with pytest.raises(RateLimited) as refused:
        budget_reserve(team=team, api_key=None, tokens=1, now=T0)
    assert refused.value.code == "team_quota_exceeded"
    assert refused.value.headers["x-ratelimit-remaining-tokens"] == "0"

    budget_settle(reservation=Reservation.objects.get(pk=other.pk), actual=100, now=T0)
    assert QuotaCounter.objects.get().used == 9100
    assert quota_used(key=day(limit), now=T0) == 9600
    budget_reserve(team=team, api_key=None, tokens=400, now=T0)
    # The next day starts afresh, seeded from its own (new) counter.
    tomorrow = T0 + timedelta(days=1)
    budget_reserve(team=team, api_key=None, tokens=10_000, now=tomorrow)
    assert quota_used(key=day(limit, tomorrow), now=tomorrow) == 10_000


@pytest.mark.django_db(transaction=True)
def test_the_sweep_reconciles_redis_after_a_crash(team: Team) -> None:
    limit = Limit.objects.create(team=team, daily_tokens=1000)
    # A process takes a reservation and dies before writing its row.
    budget_reserve(team=team, api_key=None, tokens=800, defer_record=True, now=T0)
    assert not Reservation.objects.exists() and not QuotaCounter.objects.exists()
    with pytest.raises(RateLimited):
        budget_reserve(team=team, api_key=None, tokens=300, now=T0)
    later = T0 + timedelta(seconds=settings.RESERVATION_TTL_SECONDS + 60)
    assert reservations_release_expired(now=later) == 0  # no row to release
    assert quota_used(key=day(limit), now=later) == 0  # its hold expired in Redis
    budget_reserve(team=team, api_key=None, tokens=1000, now=later)

    # Redis and the record disagree (Redis restored from an old snapshot, say, lacks 150
    # settled tokens): the job resets what settled to the database's figure and keeps
    # what is held.
    QuotaCounter.objects.create(limit=limit, period="day", starts_on=later.date(), used=150)
    assert quota_used(key=day(limit), now=later) == 1000
    reservations_release_expired(now=later)
    assert quota_used(key=day(limit), now=later) == 1150


@pytest.mark.django_db(transaction=True)
def test_concurrent_deferred_reservations_never_overspend_a_fresh_quota(team: Team) -> None:
    """32 threads at once on a period no request has seeded yet: every one seeds and
    charges, settles on what it used; exactly what fits is admitted."""
    limit = Limit.objects.create(team=team, daily_tokens=10_000, max_concurrent_streams=64)
    barrier = threading.Barrier(32)
    outcomes: list[str] = []
    lock = threading.Lock()

    def request() -> None:
        barrier.wait()
        try:
            reservation = budget_reserve(team=team, api_key=None, tokens=1000, defer_record=True)
            budget_settle(reservation=reservation, actual=900)
            result = "admitted"
        except RateLimited:
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
    assert sorted(set(outcomes)) <= ["admitted", "refused"], outcomes
    admitted = outcomes.count("admitted")
    assert 10 <= admitted <= 11  # 1000 held each; refunds make room for at most one more
    now = datetime.now(UTC)
    assert QuotaCounter.objects.get().used == 900 * admitted
    assert quota_used(key=day(limit, now), now=now) == 900 * admitted <= 10_000
    rows = Reservation.objects.filter(team=team)
    assert rows.count() == admitted and not rows.filter(settled_at__isnull=True).exists()
    assert len(set(rows.values_list("pk", flat=True))) == admitted
