"""Keys that expire (exactly, though cached) and keys whose user was deactivated or left
the team (like a revocation, within ``API_KEY_CACHE_SECONDS``)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiKey, Membership, Team
from apps.accounts.selectors import api_key_cache
from apps.accounts.services import api_key_create, membership_add
from apps.core.exceptions import InvalidRequest
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


class Clock:
    """Django's clock, moved by the test (the key cache keeps its own monotonic one)."""

    def __init__(self) -> None:
        self.now = timezone.now()

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(timezone, "now", fake)
    return fake


@pytest.fixture
def cached(settings: Any) -> Iterator[None]:
    """Keys cached for an hour: whatever these tests see is not a fresh read."""
    settings.API_KEY_CACHE_SECONDS = 3600
    api_key_cache().clear()
    yield
    api_key_cache().clear()


@pytest.fixture
def member(team: Team, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user("mo", password="a-long-password-1")
    membership_add(team=team, user=user, role=Membership.Role.MEMBER)
    return user


def error_code(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_createapikey_expires_in_days_and_the_cached_key_expires_exactly(
    team: Team, clock: Clock, cached: None
) -> None:
    out = StringIO()
    call_command(
        "createapikey",
        "--team",
        team.name,
        "--scopes",
        "read",
        "--expires-in-days",
        "2",
        stdout=out,
    )
    secret = out.getvalue().strip()
    api_key = ApiKey.objects.get()
    assert api_key.expires_at == clock.now + timedelta(days=2)
    client = client_for(secret)
    assert client.get("/api/v1/collections").status_code == 200  # now cached

    clock.now = api_key.expires_at - timedelta(microseconds=1)
    assert client.get("/api/v1/collections").status_code == 200
    clock.now = api_key.expires_at
    refused = client.get("/api/v1/collections")
    assert error_code(refused) == (401, "expired_api_key")
    assert refused["WWW-Authenticate"] == "Bearer"


def test_createapikey_refuses_a_lifetime_of_no_days(team: Team) -> None:
    with pytest.raises(CommandError, match="expires_in_days must be 1 to 3650"):
        call_command("createapikey", "--team", team.name, "--expires-in-days", "0")
    assert not ApiKey.objects.exists()


def test_the_api_issues_an_expiring_key_and_lists_its_expiry(
    team: Team, member: Any, clock: Clock
) -> None:
    session = APIClient()
    session.force_login(member)
    created = session.post(
        "/api/v1/keys", {"scopes": ["read"], "expires_in_days": 30}, format="json"
    )
    assert created.status_code == 201, created.json()
    expected = (clock.now + timedelta(days=30)).isoformat().replace("+00:00", "Z")
    assert created.json()["expires_at"] == expected
    assert session.get("/api/v1/keys").json()["results"][0]["expires_at"] == expected
    never = session.post("/api/v1/keys", {"scopes": ["read"]}, format="json").json()
    assert never["expires_at"] is None

    too_long = session.post(
        "/api/v1/keys", {"scopes": ["read"], "expires_in_days": 3651}, format="json"
    )
    assert too_long.status_code == 400
    assert too_long.json()["error"]["param"] == "expires_in_days"


def test_a_key_never_issues_a_key_that_outlives_it(team: Team, member: Any, clock: Clock) -> None:
    parent_expiry = clock.now + timedelta(days=7)
    parent = api_key_create(
        team=team, scopes=["read", "keys"], user=member, expires_at=parent_expiry
    )
    with_key = client_for(parent.secret)

    unbounded = with_key.post("/api/v1/keys", {"scopes": ["read"]}, format="json")
    longer = with_key.post(
        "/api/v1/keys", {"scopes": ["read"], "expires_in_days": 30}, format="json"
    )
    shorter = with_key.post(
        "/api/v1/keys", {"scopes": ["read"], "expires_in_days": 1}, format="json"
    )
    children = ApiKey.objects.exclude(pk=parent.api_key.pk)
    by_prefix = {key.prefix: key.expires_at for key in children}
    assert by_prefix[unbounded.json()["prefix"]] == parent_expiry
    assert by_prefix[longer.json()["prefix"]] == parent_expiry
    assert by_prefix[shorter.json()["prefix"]] == clock.now + timedelta(days=1)


def test_an_expiry_in_the_past_is_refused(team: Team) -> None:
    with pytest.raises(InvalidRequest, match="must be in the future"):
        api_key_create(team=team, expires_at=timezone.now() - timedelta(seconds=1))


def test_a_key_for_a_user_of_another_team_is_refused(team: Team, django_user_model: Any) -> None:
    outsider = django_user_model.objects.create_user("ozzy", password="a-long-password-1")
    with pytest.raises(InvalidRequest, match="not a member"):
        api_key_create(team=team, user=outsider)


def test_the_admin_sets_an_expiry(team: Team, admin_client: Any, clock: Clock) -> None:
    expires = clock.now + timedelta(days=3)
    response = admin_client.post(
        "/admin/accounts/apikey/add/",
        {
            "team": team.pk,
            "name": "from admin",
            "scopes": ["read"],
            "expires_at_0": expires.strftime("%Y-%m-%d"),
            "expires_at_1": expires.strftime("%H:%M:%S"),
        },
    )
    assert response.status_code == 200, response.content.decode()[:2000]
    assert 'id="issued-key"' in response.content.decode()  # the page that shows it once
    assert ApiKey.objects.get().expires_at == expires.replace(microsecond=0)

    past = admin_client.post(
        "/admin/accounts/apikey/add/",
        {
            "team": team.pk,
            "scopes": ["read"],
            "expires_at_0": "2001-01-01",
            "expires_at_1": "0:0",
        },
    )
    assert past.status_code == 200
    assert "must be in the future" in past.content.decode()
    assert ApiKey.objects.count() == 1


@pytest.mark.parametrize("change", ["deactivated", "left the team"])
def test_a_key_stops_working_when_its_user_is_deactivated_or_leaves(
    team: Team, member: Any, settings: Any, change: str
) -> None:
    settings.API_KEY_CACHE_SECONDS = 0  # the change is seen by the next request
    client = client_for(api_key_create(team=team, scopes=["read"], user=member).secret)
    assert client.get("/api/v1/collections").status_code == 200

    if change == "deactivated":
        member.is_active = False
        member.save(update_fields=["is_active"])
    else:
        Membership.objects.filter(team=team, user=member).delete()

    refused = client.get("/api/v1/collections")
    assert error_code(refused) == (401, "revoked_api_key")
    assert "deactivated or left the team" in refused.json()["error"]["message"]


def test_deactivation_applies_once_the_cached_key_is_older_than_the_window(
    team: Team, member: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.API_KEY_CACHE_SECONDS = 5
    cache = api_key_cache()
    cache.clear()
    ticks = iter([1000.0, 1004.9, 1005.0, 1005.0])
    monkeypatch.setattr(cache, "clock", lambda: next(ticks))
    client = client_for(api_key_create(team=team, scopes=["read"], user=member).secret)
    assert client.get("/api/v1/collections").status_code == 200  # loaded at 1000

    member.is_active = False
    member.save(update_fields=["is_active"])
    assert client.get("/api/v1/collections").status_code == 200  # 4.9 s: the cached row
    assert error_code(client.get("/api/v1/collections")) == (401, "revoked_api_key")
    cache.clear()


def test_a_team_key_of_no_user_is_unaffected(team: Team, issued_key: Any) -> None:
    assert client_for(issued_key.secret).get("/api/v1/collections").status_code == 200
