"""/api/v1/keys/{prefix}/limits: a team's owners and admins set its keys' limits (which only
narrow the team's); members read those of their own keys. Every change is audited."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Membership, Team
from apps.accounts.services import api_key_create, membership_add
from apps.core.models import AuditEvent
from apps.usage.models import Limit
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

UNLIMITED = dict.fromkeys(
    [
        "burst_tokens",
        "tokens_per_minute",
        "daily_tokens",
        "monthly_tokens",
        "max_concurrent_streams",
        "max_tokens",
        "daily_usd",
        "monthly_usd",
        "allowed_models",
    ]
)


def user_with(team: Team, role: str, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user(f"{role}-1", password="long-password-1")
    membership_add(team=team, user=user, role=role)
    return user


def session_of(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.mark.parametrize("role", [Membership.Role.OWNER, Membership.Role.ADMIN])
def test_owners_and_admins_set_a_keys_limits(role: str, team: Team, django_user_model: Any) -> None:
    manager = user_with(team, role, django_user_model)
    member = user_with(team, Membership.Role.MEMBER, django_user_model)
    key = api_key_create(team=team, scopes=["chat", "read"], user=member)
    path = f"/api/v1/keys/{key.api_key.prefix}/limits"
    client = session_of(manager)
    assert client.get(path).json() == UNLIMITED

    response = client.put(path, {"daily_tokens": 1000, "max_tokens": 64}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {**UNLIMITED, "daily_tokens": 1000, "max_tokens": 64}
    limit = Limit.objects.get(api_key=key.api_key)
    assert (limit.team, limit.daily_tokens, limit.max_tokens) == (team, 1000, 64)
    # The limit applies to the key: its quota report shows it.
    quota = client_for(key.secret).get("/api/v1/quota").json()
    (entry,) = [e for e in quota["limits"] if e["scope"] == f"key {key.api_key.prefix}"]
    assert (entry["max_tokens"], entry["day"]["limit"]) == (64, 1000)

    replaced = client.put(path, {"daily_tokens": 500}, format="json").json()
    assert replaced == {**UNLIMITED, "daily_tokens": 500}  # PUT: what is left out is unlimited
    events = AuditEvent.objects.filter(action__startswith="limit.").order_by("pk")
    assert [(e.action, e.actor, e.target) for e in events] == [
        ("limit.created", f"user {manager.username}", f"key {key.api_key.prefix}"),
        ("limit.changed", f"user {manager.username}", f"key {key.api_key.prefix}"),
    ]
    assert events[1].detail["before"]["max_tokens"] == 64
    assert events[1].detail["after"]["max_tokens"] is None


def test_a_member_reads_but_never_sets_limits(team: Team, django_user_model: Any) -> None:
    member = user_with(team, Membership.Role.MEMBER, django_user_model)
    owner = user_with(team, Membership.Role.OWNER, django_user_model)
    own = api_key_create(team=team, scopes=["chat"], user=member).api_key
    owners = api_key_create(team=team, scopes=["chat"], user=owner).api_key
    client = session_of(member)

    assert client.get(f"/api/v1/keys/{own.prefix}/limits").status_code == 200
    refused = client.put(f"/api/v1/keys/{own.prefix}/limits", {"daily_tokens": 1}, format="json")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "role_forbidden"
    assert client.get(f"/api/v1/keys/{owners.prefix}/limits").status_code == 404
    assert not Limit.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="limit.").exists()


def test_another_teams_key_is_a_404(team: Team, other_team: Team, django_user_model: Any) -> None:
    owner = user_with(team, Membership.Role.OWNER, django_user_model)
    foreign = api_key_create(team=other_team, scopes=["chat"]).api_key
    response = session_of(owner).put(
        f"/api/v1/keys/{foreign.prefix}/limits", {"daily_tokens": 1}, format="json"
    )
    assert response.status_code == 404
    assert not Limit.objects.exists()


def test_limits_are_validated(team: Team, django_user_model: Any) -> None:
    owner = user_with(team, Membership.Role.OWNER, django_user_model)
    key = api_key_create(team=team, scopes=["chat"], user=owner).api_key
    response = session_of(owner).put(
        f"/api/v1/keys/{key.prefix}/limits", {"daily_tokens": -1}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "daily_tokens"


def test_a_keys_money_budget_and_models_are_set_through_the_api(
    team: Team, django_user_model: Any
) -> None:
    manager = user_with(team, Membership.Role.OWNER, django_user_model)
    key = api_key_create(team=team, scopes=["chat", "read"], user=manager)
    path = f"/api/v1/keys/{key.api_key.prefix}/limits"
    client = session_of(manager)
    body = {"daily_usd": "1.5", "monthly_usd": 30, "allowed_models": ["small"]}
    response = client.put(path, body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {
        **UNLIMITED,
        "daily_usd": "1.500000",
        "monthly_usd": "30.000000",
        "allowed_models": ["small"],
    }
    limit = Limit.objects.get(api_key=key.api_key)
    assert (limit.daily_usd, limit.allowed_models) == (Decimal("1.5"), ["small"])
    event = AuditEvent.objects.filter(action="limit.created").get()
    assert event.detail["after"]["daily_usd"] == "1.500000"
    quota = client_for(key.secret).get("/api/v1/quota").json()
    (entry,) = [e for e in quota["limits"] if e["scope"] == f"key {key.api_key.prefix}"]
    assert entry["day_usd"]["limit"] == entry["day_usd"]["remaining"] == "1.500000"


@pytest.mark.parametrize(
    "body",
    [
        {"allowed_models": ["huge"]},
        {"daily_usd": -1},
        {"monthly_usd": "lots"},
        {"max_concurrent_streams": 2**40},
        {"daily_tokens": 2**64},
    ],
)
def test_a_keys_limits_refuse_unknown_models_and_bad_amounts(
    body: dict[str, Any], team: Team, django_user_model: Any
) -> None:
    manager = user_with(team, Membership.Role.OWNER, django_user_model)
    key = api_key_create(team=team, scopes=["chat", "read"], user=manager)
    response = session_of(manager).put(
        f"/api/v1/keys/{key.api_key.prefix}/limits", body, format="json"
    )
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["param"] == next(iter(body))
    assert not Limit.objects.filter(api_key=key.api_key).exists()
