"""Model allow-lists (issue 31): a team's or a key's limits name the aliases it may use.
Asking for another is a 403 ``model_not_allowed`` on both surfaces, before anything is
reserved or sent; ``auto`` routes among the allowed ones; an alias whose fallback is not
allowed is refused too (the fallback would otherwise answer)."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import httpx
import pytest
from django.core.management import call_command

from apps.accounts.models import Team
from apps.accounts.services import api_key_create
from apps.usage.models import Limit, UsageRecord
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.apps.chat.test_routing import Tier
from tests.fake_upstream import FakeUpstream, fake_upstream

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tiers(upstream: FakeUpstream, settings: Any, team: Team) -> Iterator[Tier]:
    """Two fake upstreams and the registry over them (as in ``test_routing``)."""
    with fake_upstream() as second:
        settings.ROUTER_SMALL_MAX_PROMPT_TOKENS = 120
        yield Tier(upstream, second, settings, team.pk)


def refused(reply: httpx.Response) -> None:
    assert reply.status_code == 403, reply.text
    assert reply.json()["error"]["code"] == "model_not_allowed"


def test_an_alias_off_the_teams_list_is_refused_on_both_surfaces(
    tiers: Tier, http: httpx.Client, team: Team
) -> None:
    tiers.register(small={"upstreams": [tiers.a.base_url]}, large={"upstreams": [tiers.b.base_url]})
    Limit.objects.create(team=team, allowed_models=["small"])
    url = f"/api/v1/conversations/{conversation_for(http)}/messages"
    refused(http.post(url, json={"content": "Hi", "model": "large", "top_k": 0}))
    body = {"model": "large", "messages": [{"role": "user", "content": "Hi"}]}
    refused(http.post("/v1/chat/completions", json=body))
    assert tiers.b.requests == [] and not UsageRecord.objects.exists()
    assert http.post(url, json={"content": "Hi", "model": "small", "top_k": 0}).status_code == 201


def test_auto_routes_only_to_an_allowed_alias(tiers: Tier, http: httpx.Client, team: Team) -> None:
    tiers.register(small={"upstreams": [tiers.a.base_url]}, large={"upstreams": [tiers.b.base_url]})
    Limit.objects.create(team=team, allowed_models=["small"])
    long_question = "Explain " + "the pantry key and the blue door " * 60
    frames = ask_stream(http, conversation_for(http), content=long_question, model="auto", top_k=0)
    assert frames[0]["data"]["model"] == "small" and tiers.b.requests == []


def test_a_keys_list_narrows_the_teams(tiers: Tier, team: Team, asgi_server: str) -> None:
    tiers.register(small={"upstreams": [tiers.a.base_url]}, large={"upstreams": [tiers.b.base_url]})
    Limit.objects.create(team=team, allowed_models=["small", "large"])
    issued = api_key_create(team=team, name="narrow")
    Limit.objects.create(team=team, api_key=issued.api_key, allowed_models=["large"])
    headers = {"Authorization": f"Bearer {issued.secret}"}
    with httpx.Client(base_url=asgi_server, headers=headers, timeout=30) as http:
        body = {"messages": [{"role": "user", "content": "Hi"}], "rag": {"enabled": False}}
        refused(http.post("/v1/chat/completions", json={**body, "model": "small"}))
        ok = http.post("/v1/chat/completions", json={**body, "model": "large"})
        assert ok.status_code == 200 and ok.json()["model"] == "large"


def test_an_alias_whose_fallback_is_not_allowed_is_refused(
    tiers: Tier, http: httpx.Client, team: Team
) -> None:
    tiers.register(
        small={"upstreams": [tiers.a.base_url]},
        large={"upstreams": [tiers.b.base_url], "fallback": "small"},
    )
    Limit.objects.create(team=team, allowed_models=["large"])
    url = f"/api/v1/conversations/{conversation_for(http)}/messages"
    refused(http.post(url, json={"content": "Hi", "model": "large", "top_k": 0}))


def test_setlimits_sets_and_clears_the_list(team: Team, settings: Any) -> None:
    out = StringIO()
    call_command("setlimits", "--team", team.name, "--models", "small", stdout=out)
    assert Limit.objects.get(team=team, api_key=None).allowed_models == ["small"]
    assert "models = small" in out.getvalue()
    call_command("setlimits", "--team", team.name, "--models", "none", stdout=StringIO())
    assert Limit.objects.get(team=team, api_key=None).allowed_models is None
