"""Money budgets through both surfaces (issue 31): an answer holds its worst-case cost (its
prompt and every output token it may write, at the dearest price that may serve it) in
the one admission step, is refused 429 ``budget_exceeded`` before the tier when that does
not fit, and is charged its actual cost; a tag's budget binds the requests under it."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from apps.accounts.models import Team
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord
from apps.usage.services import cost_of
from apps.usage.values import nanos_of
from inference import Price
from tests.apps.chat.conftest import conversation_for
from tests.apps.chat.test_routing import Tier
from tests.fake_upstream import FakeUpstream, fake_upstream

pytestmark = pytest.mark.django_db(transaction=True)

CHEAP = {"input": 2.0, "cached_input": 1.0, "output": 6.0}
DEAR = {"input": 10.0, "cached_input": 5.0, "output": 30.0}


@pytest.fixture
def priced(settings: Any) -> None:
    settings.MODEL_PRICES = {"small": CHEAP, "large": DEAR}


def budget_refused(reply: httpx.Response) -> None:
    assert reply.status_code == 429, reply.text
    assert reply.json()["error"]["code"] == "budget_exceeded"
    assert int(reply.headers["retry-after"]) > 0
    assert "x-ratelimit-remaining-usd" in reply.headers


def test_an_answer_is_charged_its_cost_against_the_teams_budget(
    priced: None, http: httpx.Client, upstream: FakeUpstream, team: Team
) -> None:
    limit = Limit.objects.create(team=team, daily_usd=Decimal("1"))
    url = f"/api/v1/conversations/{conversation_for(http)}/messages"
    reply = http.post(url, json={"content": "Hi", "top_k": 0, "max_tokens": 50})
    assert reply.status_code == 201, reply.text
    row = UsageRecord.objects.get(kind=UsageRecord.Kind.CHAT)
    reservation = Reservation.objects.get(team=team)
    # Held: the prompt and all 50 output tokens at the small alias's price.
    worst = cost_of(
        model="small", prompt=row.prompt_tokens, cached=0, completion=50, price=Price(**CHEAP)
    )
    assert reservation.cost_nanos == nanos_of(worst)
    assert reservation.actual_cost_nanos == nanos_of(row.cost_usd) > 0
    assert QuotaCounter.objects.get(limit=limit, unit="usd").used == nanos_of(row.cost_usd)


def test_a_spent_budget_is_refused_before_the_tier_on_both_surfaces(
    priced: None, http: httpx.Client, upstream: FakeUpstream, team: Team
) -> None:
    Limit.objects.create(team=team, daily_usd=Decimal("0.0005"))  # 500 micro-dollars
    url = f"/api/v1/conversations/{conversation_for(http)}/messages"
    budget_refused(http.post(url, json={"content": "Hi", "top_k": 0, "max_tokens": 100}))
    body = {"model": "small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100}
    budget_refused(http.post("/v1/chat/completions", json=body))
    assert upstream.requests == [] and not UsageRecord.objects.filter(kind="chat").exists()
    # 100 output tokens cost $0.0006 alone; 10 cost $0.00006, and fit with the prompt.
    small = http.post("/v1/chat/completions", json={**body, "max_tokens": 10})
    assert small.status_code == 200, small.text


def test_a_tags_budget_binds_the_requests_under_that_tag(
    priced: None, http: httpx.Client, upstream: FakeUpstream, team: Team
) -> None:
    Limit.objects.create(team=team, tag="experiments", daily_usd=Decimal("0.0005"))
    body = {"model": "small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100}
    tagged = {**body, "metadata": {"tag": "experiments"}}
    budget_refused(http.post("/v1/chat/completions", json=tagged))
    url = f"/api/v1/conversations/{conversation_for(http)}/messages"
    native = {"content": "Hi", "top_k": 0, "max_tokens": 100, "tag": "experiments"}
    budget_refused(http.post(url, json=native))
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    other = {**body, "metadata": {"tag": "production"}}
    assert http.post("/v1/chat/completions", json=other).status_code == 200


def test_the_estimate_says_which_budget_refuses_and_holds_nothing(
    priced: None, http: httpx.Client, upstream: FakeUpstream, team: Team
) -> None:
    limit = Limit.objects.create(team=team, daily_usd=Decimal("0.0005"))
    body = {"model": "small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100}
    estimate = http.post("/api/v1/estimate", json=body)
    assert estimate.status_code == 200, estimate.text
    assert estimate.json()["admitted"] is False
    assert estimate.json()["error"]["code"] == "budget_exceeded"
    fits = http.post("/api/v1/estimate", json={**body, "max_tokens": 10}).json()
    assert fits["admitted"] is True
    counters = QuotaCounter.objects.filter(limit=limit, unit="usd")
    assert all(counter.used == 0 for counter in counters)


@pytest.fixture
def tiers(upstream: FakeUpstream, settings: Any, team: Team) -> Iterator[Tier]:
    with fake_upstream() as second:
        settings.ROUTER_SMALL_MAX_PROMPT_TOKENS = 120
        yield Tier(upstream, second, settings, team.pk)


def test_auto_holds_at_the_dearer_alias_and_charges_the_one_that_served(
    tiers: Tier, http: httpx.Client, team: Team
) -> None:
    """Before retrieval ``auto`` may still route to the dear alias, so admission holds its
    price; the cheap one serves and is charged at its own."""
    tiers.register(
        small={"upstreams": [tiers.a.base_url], "price": CHEAP},
        large={"upstreams": [tiers.b.base_url], "price": DEAR},
    )
    Limit.objects.create(team=team, daily_usd=Decimal("1"))
    url = f"/api/v1/conversations/{conversation_for(http)}/messages"
    reply = http.post(url, json={"content": "Hi", "model": "auto", "top_k": 0, "max_tokens": 40})
    assert reply.status_code == 201, reply.text
    row = UsageRecord.objects.get(kind=UsageRecord.Kind.CHAT)
    assert row.model == "small"
    reservation = Reservation.objects.get(team=team)
    dear = cost_of(
        model="large", prompt=row.prompt_tokens, cached=0, completion=40, price=Price(**DEAR)
    )
    assert reservation.cost_nanos >= nanos_of(dear)
    assert reservation.actual_cost_nanos == nanos_of(row.cost_usd)
    cheap = cost_of(
        model="small",
        prompt=row.prompt_tokens,
        cached=0,
        completion=row.completion_tokens,
        price=Price(**CHEAP),
    )
    assert row.cost_usd == cheap


@pytest.fixture
def tier(upstream: FakeUpstream, settings: Any, team: Team) -> Iterator[Tier]:
    with fake_upstream() as second:
        yield Tier(upstream, second, settings, team.pk)


def test_a_cached_input_priced_above_input_is_held_at_its_price(
    tier: Tier, http: httpx.Client, team: Team
) -> None:
    """An operator may price cached input above input: the hold takes the dearer of the
    two for the whole prompt, so the cost settled never passes it."""
    price = {"input": 1.0, "cached_input": 50.0, "output": 1.0}
    tier.register(small={"upstreams": [tier.a.base_url], "price": price, "server": "vllm"})
    tier.a.script.usage = "final_chunk"
    tier.a.script.usage_override = {
        "prompt_tokens": 60,
        "completion_tokens": 3,
        "total_tokens": 63,
        "prompt_tokens_details": {"cached_tokens": 59},
    }
    Limit.objects.create(team=team, daily_usd=Decimal("1"))
    url = f"/api/v1/conversations/{conversation_for(http)}/messages"
    reply = http.post(url, json={"content": "Hi", "top_k": 0, "max_tokens": 10})
    assert reply.status_code == 201, reply.text
    reservation = Reservation.objects.get(team=team)
    assert 0 < reservation.actual_cost_nanos <= reservation.cost_nanos


def test_a_tier_reporting_more_than_was_held_never_passes_the_budget(
    tier: Tier, http: httpx.Client, team: Team
) -> None:
    """A tier that reports a million prompt tokens ($2) on a $0.01 budget: the ledger keeps
    what it says, the budget is charged what was held at most (the rest counted apart)."""
    tier.register(small={"upstreams": [tier.a.base_url], "price": CHEAP})
    tier.a.script.usage = "final_chunk"
    tier.a.script.usage_override = {
        "prompt_tokens": 1_000_000,
        "completion_tokens": 3,
        "total_tokens": 1_000_003,
    }
    budget = Decimal("0.01")
    limit = Limit.objects.create(team=team, daily_usd=budget)
    url = f"/api/v1/conversations/{conversation_for(http)}/messages"
    reply = http.post(url, json={"content": "Hi", "top_k": 0, "max_tokens": 10})
    assert reply.status_code == 201, reply.text
    reservation = Reservation.objects.get(team=team)
    assert QuotaCounter.objects.get(limit=limit, unit="usd").used == reservation.cost_nanos
    assert UsageRecord.objects.get(kind="chat").cost_usd > budget  # the ledger says it all


def test_the_estimate_admits_exactly_what_an_auto_answers_admission_does(
    tiers: Tier, http: httpx.Client, team: Team
) -> None:
    """Before retrieval ``auto`` may still route to the dear alias, so an answer holds its
    price: the estimate asks for that same hold."""
    tiers.register(
        small={"upstreams": [tiers.a.base_url], "price": CHEAP},
        large={"upstreams": [tiers.b.base_url], "price": DEAR},
    )
    Limit.objects.create(team=team, daily_usd=Decimal("0.001"))  # the cheap fits, the dear not
    conversation = conversation_for(http)
    body = {"content": "Hi", "model": "auto", "top_k": 0, "max_tokens": 40}
    said = http.post("/api/v1/estimate", json={**body, "conversation": conversation}).json()
    reply = http.post(f"/api/v1/conversations/{conversation}/messages", json=body)
    assert said["admitted"] is False and reply.status_code == 429, (said, reply.text)
    assert said["error"]["code"] == reply.json()["error"]["code"] == "budget_exceeded"
