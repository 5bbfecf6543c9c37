"""Money budgets (issue 31): a limit in USD per day or month, reserved at the worst-case cost
in the same single admission step as the token quotas, settled at the actual cost, counted
in nano-dollars; a refusal is 429 ``budget_exceeded`` with the period's reset.

Tests taking ``limiter_store`` run twice: in the database, then in real Redis.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, IntegrityError

from apps.accounts.models import Team
from apps.accounts.services import api_key_create
from apps.core.audit import Actor
from apps.usage.budgets import (
    RateLimited,
    budget_extend,
    budget_reserve,
    budget_settle,
    limits_of,
    quota_used,
    reservations_release_expired,
)
from apps.usage.budgets import settle as settle_module
from apps.usage.limiters import USD, QuotaKey, RedisLimiter, limiter
from apps.usage.models import Limit, QuotaCounter, Reservation
from apps.usage.selectors import quota_report
from apps.usage.services import limit_delete
from apps.usage.values import nanos_of
from tests.conftest import reachable_redis_url

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
CENT = Decimal("0.01")


def spent(limit: Limit, now: datetime = T0, period: str = "day") -> int:
    """Nano-dollars ``limit``'s money budget counts (settled plus held), in either store."""
    starts_on = now.date() if period == "day" else now.date().replace(day=1)
    return quota_used(key=QuotaKey(limit.pk, period, starts_on, USD), now=now)


def reserve(team: Team, cost: Decimal, *, now: datetime = T0, **kwargs: Any) -> Reservation:
    return budget_reserve(team=team, api_key=None, tokens=100, cost=cost, now=now, **kwargs)


@pytest.mark.django_db
def test_a_daily_budget_holds_the_worst_case_and_settles_the_actual_cost(
    team: Team, limiter_store: str
) -> None:
    limit = Limit.objects.create(team=team, daily_usd=Decimal("0.05"))
    first = reserve(team, 3 * CENT)
    assert spent(limit) == nanos_of(3 * CENT) and first.cost_nanos == 30_000_000
    with pytest.raises(RateLimited) as refused:
        reserve(team, 3 * CENT)
    error = refused.value
    assert (error.status, error.code) == (429, "budget_exceeded")
    assert error.headers["Retry-After"] == str(12 * 3600)  # midnight UTC, the team's zone
    assert error.headers["x-ratelimit-limit-usd"] == "0.050000"
    assert error.headers["x-ratelimit-remaining-usd"] == "0.020000"
    assert error.headers["x-ratelimit-reset-usd"] == f"{12 * 3600}s"

    budget_settle(reservation=first, actual=40, cost=Decimal("0.0012345678"), now=T0)
    assert spent(limit) == 1_234_568  # rounded up to the nano-dollar
    reserve(team, Decimal("0.048765432"))  # what is left fits, to the nano-dollar
    with pytest.raises(RateLimited):
        reserve(team, Decimal("0.000000001"))
    # Tomorrow is a new day.
    reserve(team, Decimal("0.05"), now=T0 + timedelta(days=1))


@pytest.mark.django_db
def test_the_budgets_period_is_the_teams_day_and_month(team: Team, limiter_store: str) -> None:
    team.time_zone = "America/New_York"
    team.save()
    limit = Limit.objects.create(team=team, daily_usd=CENT, monthly_usd=2 * CENT)
    late = datetime(2026, 12, 3, 3, 0, tzinfo=UTC)  # still Dec 2 in New York: 10 pm
    first = reserve(team, CENT, now=late)
    with pytest.raises(RateLimited) as refused:
        reserve(team, CENT, now=late)
    assert refused.value.headers["Retry-After"] == str(2 * 3600)
    budget_settle(reservation=first, actual=100, cost=CENT, now=late)
    second = reserve(team, CENT, now=late + timedelta(hours=2))  # Dec 3 there
    budget_settle(reservation=second, actual=100, cost=CENT, now=late + timedelta(hours=2))
    with pytest.raises(RateLimited) as monthly:
        reserve(team, CENT, now=late + timedelta(days=1, hours=2))
    assert monthly.value.code == "budget_exceeded"
    assert monthly.value.headers["x-ratelimit-limit-usd"] == "0.020000"
    assert spent(limit, late + timedelta(hours=2), "month") == nanos_of(2 * CENT)


@pytest.mark.django_db
def test_tokens_and_money_are_held_in_one_step(team: Team, limiter_store: str) -> None:
    """A refusal by either leaves the other untouched: one admission, all or nothing."""
    limit = Limit.objects.create(team=team, daily_tokens=1000, daily_usd=CENT)
    with pytest.raises(RateLimited) as by_money:
        budget_reserve(team=team, api_key=None, tokens=10, cost=2 * CENT, now=T0)
    assert by_money.value.code == "budget_exceeded"
    with pytest.raises(RateLimited) as by_tokens:
        budget_reserve(team=team, api_key=None, tokens=1001, cost=CENT, now=T0)
    assert by_tokens.value.code == "team_quota_exceeded"
    tokens = QuotaKey(limit.pk, "day", T0.date())
    assert (quota_used(key=tokens, now=T0), spent(limit)) == (0, 0)
    assert not Reservation.objects.exists()


@pytest.mark.django_db
def test_extending_adds_to_the_money_held_all_or_nothing(team: Team, limiter_store: str) -> None:
    limit = Limit.objects.create(team=team, daily_usd=5 * CENT)
    held = reserve(team, 2 * CENT)
    budget_extend(reservation=held, tokens=50, cost=2 * CENT, now=T0)
    assert spent(limit) == nanos_of(4 * CENT)
    with pytest.raises(RateLimited):
        budget_extend(reservation=held, tokens=50, cost=2 * CENT, now=T0)
    assert spent(limit) == nanos_of(4 * CENT)
    assert (held.tokens, held.cost_nanos) == (150, nanos_of(4 * CENT))
    budget_settle(reservation=held, actual=120, cost=CENT, now=T0)
    assert spent(limit) == nanos_of(CENT)


@pytest.mark.django_db
def test_an_abandoned_hold_gives_its_money_back(team: Team, limiter_store: str) -> None:
    limit = Limit.objects.create(team=team, daily_usd=CENT)
    reserve(team, CENT)
    later = T0 + timedelta(hours=2)
    assert reservations_release_expired(now=later) == 1
    assert spent(limit, later) == 0


@pytest.mark.django_db
def test_a_tags_budget_applies_to_requests_under_that_tag_only(
    team: Team, limiter_store: str
) -> None:
    Limit.objects.create(team=team, tag="experiments", daily_usd=CENT)
    limits = list(limits_of(team=team, api_key=None, tag="experiments"))
    reserve(team, CENT, limits=limits)
    with pytest.raises(RateLimited) as refused:
        reserve(team, CENT, limits=limits)
    assert refused.value.code == "budget_exceeded"
    reserve(team, 10 * CENT, limits=list(limits_of(team=team, api_key=None, tag="prod")))
    reserve(team, 10 * CENT)  # untagged: the team has no budget of its own


@pytest.mark.django_db
def test_a_keys_budget_narrows_the_teams(team: Team, limiter_store: str) -> None:
    Limit.objects.create(team=team, daily_usd=10 * CENT)
    issued = api_key_create(team=team, name="cheap")
    Limit.objects.create(team=team, api_key=issued.api_key, daily_usd=CENT)
    budget_reserve(team=team, api_key=issued.api_key, tokens=1, cost=CENT, now=T0)
    with pytest.raises(RateLimited):
        budget_reserve(team=team, api_key=issued.api_key, tokens=1, cost=CENT, now=T0)
    reserve(team, 9 * CENT)  # the team's other callers have what is left of its budget
    with pytest.raises(RateLimited):
        reserve(team, CENT)


@pytest.mark.django_db
def test_one_budget_per_tag_and_tags_are_the_teams(team: Team) -> None:
    Limit.objects.create(team=team)
    Limit.objects.create(team=team, tag="prod", daily_usd=CENT)
    with pytest.raises(IntegrityError):
        Limit.objects.create(team=team, tag="prod")


@pytest.mark.django_db
def test_a_tags_budget_has_no_key(team: Team) -> None:
    issued = api_key_create(team=team, name="k")
    with pytest.raises(IntegrityError):
        Limit.objects.create(team=team, api_key=issued.api_key, tag="prod")


@pytest.mark.django_db(transaction=True)
def test_redis_seeds_a_budget_from_the_record_and_its_open_holds(team: Team, settings: Any) -> None:
    """Redis lost its state: the record (what settled) plus the open holds come back."""
    settings.RATE_LIMIT_REDIS_URL = reachable_redis_url()
    limit = Limit.objects.create(team=team, daily_usd=10 * CENT)
    held = reserve(team, 3 * CENT)
    settled = reserve(team, 2 * CENT)
    budget_settle(reservation=settled, actual=10, cost=CENT, now=T0)
    store = limiter()
    assert isinstance(store, RedisLimiter)
    store.forget([limit.pk])
    assert store.quota_used(QuotaKey(limit.pk, "day", T0.date(), USD), T0) is None
    reserve(team, 6 * CENT)  # seeded: 1 settled + 3 held, so 6 more fit
    with pytest.raises(RateLimited):
        reserve(team, Decimal("0.000000001"))
    budget_settle(reservation=Reservation.objects.get(pk=held.pk), actual=1, cost=0, now=T0)
    assert QuotaCounter.objects.get(limit=limit, unit=USD).used == nanos_of(CENT)


@pytest.mark.django_db
def test_setlimits_sets_a_tags_money_budget(team: Team) -> None:
    out = StringIO()
    call_command(
        "setlimits",
        "--team",
        team.name,
        "--tag",
        "experiments",
        "--daily-usd",
        "1.50",
        "--monthly-usd",
        "30",
        stdout=out,
    )
    limit = Limit.objects.get(team=team, tag="experiments")
    assert (limit.daily_usd, limit.monthly_usd, limit.api_key) == (
        Decimal("1.50"),
        Decimal("30"),
        None,
    )
    assert f"team {team.name} tag experiments: daily_usd = 1.50" in out.getvalue()
    call_command("setlimits", "--team", team.name, "--daily-usd", "2", stdout=StringIO())
    assert Limit.objects.get(team=team, tag="").daily_usd == Decimal("2")
    with pytest.raises(CommandError):
        call_command("setlimits", "--team", team.name, "--tag", "Bad Tag!", "--daily-usd", "1")
    with pytest.raises(CommandError):
        call_command("setlimits", "--team", team.name, "--daily-usd", "-1")


@pytest.mark.django_db(transaction=True)
def test_a_limit_deleted_while_its_answer_runs_leaves_the_settlement_whole(
    team: Team, limiter_store: str
) -> None:
    limit = Limit.objects.create(team=team, tag="exp", daily_usd=Decimal("1"))
    Limit.objects.create(team=team, daily_tokens=10_000)
    limits = list(limits_of(team=team, api_key=None, tag="exp"))
    held = reserve(team, CENT, limits=limits)
    limit_delete(limit=limit, actor=Actor.command("test"))
    budget_settle(reservation=held, actual=50, cost=CENT / 2, now=T0)
    assert Reservation.objects.get(pk=held.pk).settled_at is not None
    assert not QuotaCounter.objects.filter(limit_id=limit.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_one_reservation_that_cannot_be_released_holds_up_no_other(
    team: Team, other_team: Team, limiter_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    Limit.objects.create(team=team, daily_usd=CENT)
    Limit.objects.create(team=other_team, daily_usd=CENT)
    mine = reserve(team, CENT)
    theirs = reserve(other_team, CENT)
    real = settle_module._settle

    def failing(reservation: Reservation, *args: Any) -> None:
        if reservation.pk == mine.pk:
            raise DatabaseError("this one is broken")
        real(reservation, *args)

    monkeypatch.setattr(settle_module, "_settle", failing)
    assert reservations_release_expired(now=T0 + timedelta(hours=2)) == 1
    assert Reservation.objects.get(pk=theirs.pk).settled_at is not None
    assert Reservation.objects.get(pk=mine.pk).settled_at is None


@pytest.mark.django_db
def test_the_quota_report_shows_the_teams_tag_budgets(team: Team) -> None:
    Limit.objects.create(team=team, tag="experiments", daily_usd=CENT)
    report = quota_report(team=team, api_key=None, now=T0)
    (entry,) = report["limits"]
    assert entry["scope"] == "team tag experiments"
    assert entry["day_usd"] == {
        "limit": "0.010000",
        "used": "0.000000",
        "remaining": "0.010000",
        "resets_at": "2026-12-03T00:00:00+00:00",
    }
