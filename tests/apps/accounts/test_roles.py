"""``Membership.role`` decides who manages keys: owners and admins every key of the team,
with any scope, and its limits; members their own keys, with the scopes their role allows.
The /keys page offers what the API accepts."""

from __future__ import annotations

import re
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import ApiKey, Membership, Scope, Team
from apps.accounts.selectors import ROLE_KEY_SCOPES
from apps.accounts.services import api_key_create, membership_add

pytestmark = pytest.mark.django_db

ROLES = [Membership.Role.OWNER, Membership.Role.ADMIN, Membership.Role.MEMBER]


@pytest.fixture
def users(team: Team, django_user_model: Any) -> dict[str, Any]:
    made = {}
    for role in ROLES:
        user = django_user_model.objects.create_user(f"{role}-user", password="long-password-1")
        membership_add(team=team, user=user, role=role)
        made[role] = user
    return made


def session_of(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def offered_scopes(page: str) -> set[str]:
    """Scopes whose checkbox on the /keys page is enabled."""
    boxes = re.findall(r'<input type="checkbox" name="scope" value="(\w+)"([^>]*)>', page)
    return {value for value, rest in boxes if "disabled" not in rest}


@pytest.mark.parametrize("role", ROLES)
def test_each_role_grants_the_scopes_its_page_offers(role: str, users: dict[str, Any]) -> None:
    client = session_of(users[role])
    page = client.get("/keys").content.decode()
    offered = offered_scopes(page)
    assert offered == ROLE_KEY_SCOPES[role]

    for scope in Scope.values:
        response = client.post("/api/v1/keys", {"scopes": [scope]}, format="json")
        expected = 201 if scope in offered else 403
        assert response.status_code == expected, (role, scope, response.json())


@pytest.mark.parametrize(
    ("role", "manages_team"),
    [(Membership.Role.OWNER, True), (Membership.Role.ADMIN, True), (Membership.Role.MEMBER, False)],
)
def test_who_sees_and_revokes_a_teammates_key(
    role: str, manages_team: bool, team: Team, users: dict[str, Any]
) -> None:
    teammate = next(user for other, user in users.items() if other != role)
    theirs = api_key_create(team=team, scopes=["read"], user=teammate).api_key
    own = api_key_create(team=team, scopes=["read"], user=users[role]).api_key
    client = session_of(users[role])

    listed = {key["prefix"] for key in client.get("/api/v1/keys").json()["results"]}
    assert (theirs.prefix in listed) is manages_team
    assert own.prefix in listed
    page = client.get("/keys").content.decode()
    assert ("see and revoke every key" in page) is manages_team
    assert ('id="key-limits"' in page) is manages_team  # as PUT …/limits allows

    revoked = client.delete(f"/api/v1/keys/{theirs.prefix}")
    assert revoked.status_code == (204 if manages_team else 404)
    theirs.refresh_from_db()
    assert theirs.is_revoked is manages_team
    assert client.delete(f"/api/v1/keys/{own.prefix}").status_code == 204


def test_an_admins_key_grants_no_more_than_its_own_scopes(
    team: Team, users: dict[str, Any]
) -> None:
    admin = users[Membership.Role.ADMIN]
    key = api_key_create(team=team, scopes=["chat", "keys"], user=admin)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key.secret}")
    refused = client.post("/api/v1/keys", {"scopes": ["chat", "ingest"]}, format="json")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "scope_missing"
    assert client.post("/api/v1/keys", {"scopes": ["chat"]}, format="json").status_code == 201
    assert ApiKey.objects.filter(user=admin).count() == 2
