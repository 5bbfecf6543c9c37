"""/api/v1/keys: list, issue (shown once), revoke; roles decide who manages what, and a key
never issues a key with a scope it lacks."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import ApiKey, Membership, Team
from apps.accounts.services import api_key_create
from tests.apps.accounts.conftest import session_of
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def test_an_owner_issues_a_key_that_is_shown_once_and_works(owner: Any) -> None:
    client = session_of(owner)
    created = client.post(
        "/api/v1/keys", {"name": "sync", "scopes": ["read", "ingest"]}, format="json"
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["key"].startswith(f"rt_{body['prefix']}_")
    assert (body["name"], body["scopes"], body["user"]) == ("sync", ["ingest", "read"], "olive")
    assert body["revoked_at"] is None and body["last_used_at"] is None

    listed = client.get("/api/v1/keys").json()["results"]
    assert [key["prefix"] for key in listed] == [body["prefix"]]
    assert "key" not in listed[0] and "secret_hash" not in listed[0]

    assert client_for(body["key"]).get("/api/v1/collections").status_code == 200
    assert client.get("/api/v1/keys").json()["results"][0]["last_used_at"]


def test_revoking_a_key_makes_it_401_at_once(owner: Any) -> None:
    client = session_of(owner)
    secret = client.post("/api/v1/keys", {"scopes": ["read"]}, format="json").json()["key"]
    prefix = secret.split("_")[1]
    with_key = client_for(secret)
    assert with_key.get("/api/v1/collections").status_code == 200

    assert client.delete(f"/api/v1/keys/{prefix}").status_code == 204

    refused = with_key.get("/api/v1/collections")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "revoked_api_key"
    listed = client.get("/api/v1/keys").json()["results"]
    assert listed[0]["revoked_at"] is not None
    assert client.delete(f"/api/v1/keys/{prefix}").status_code == 204  # idempotent


def test_a_member_grants_only_the_scopes_of_their_role(member: Any) -> None:
    client = session_of(member)
    refused = client.post("/api/v1/keys", {"scopes": ["chat", "ingest"]}, format="json")
    assert refused.status_code == 403
    assert refused.json()["error"] == {
        "type": "permission_error",
        "code": "scope_missing",
        "message": "You may not grant the scope(s) ['ingest']; you may grant ['chat', 'read'].",
        "param": "scopes",
    }
    assert not ApiKey.objects.exists()
    created = client.post("/api/v1/keys", {"scopes": ["chat", "read"]}, format="json")
    assert created.status_code == 201
    assert created.json()["scopes"] == ["chat", "read"]


def test_members_see_and_revoke_only_their_own_keys_owners_every_key(
    team: Team, owner: Any, member: Any
) -> None:
    owners_key = api_key_create(team=team, scopes=["read"], user=owner).api_key
    members_key = api_key_create(team=team, scopes=["read"], user=member).api_key
    team_key = api_key_create(team=team, scopes=["read"]).api_key

    as_member = session_of(member)
    assert [k["prefix"] for k in as_member.get("/api/v1/keys").json()["results"]] == [
        members_key.prefix
    ]
    assert as_member.delete(f"/api/v1/keys/{owners_key.prefix}").status_code == 404
    assert as_member.delete(f"/api/v1/keys/{team_key.prefix}").status_code == 404
    owners_key.refresh_from_db()
    assert owners_key.revoked_at is None

    as_owner = session_of(owner)
    listed = {k["prefix"] for k in as_owner.get("/api/v1/keys").json()["results"]}
    assert listed == {owners_key.prefix, members_key.prefix, team_key.prefix}
    assert as_owner.delete(f"/api/v1/keys/{members_key.prefix}").status_code == 204
    members_key.refresh_from_db()
    assert members_key.revoked_at is not None


def test_a_key_never_issues_a_key_with_more_scopes_than_its_own(team: Team, owner: Any) -> None:
    issuer = api_key_create(team=team, scopes=["read", "keys"], user=owner)
    read_only = client_for(issuer.secret)
    refused = read_only.post("/api/v1/keys", {"scopes": ["read", "chat"]}, format="json")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "scope_missing"
    assert "['chat']" in refused.json()["error"]["message"]

    created = read_only.post("/api/v1/keys", {"scopes": ["read"]}, format="json")
    assert created.status_code == 201
    child = ApiKey.objects.get(prefix=created.json()["prefix"])
    assert (child.team, child.user, child.scopes) == (team, owner, ["read"])
    assert child.parent == issuer.api_key


def test_a_key_of_no_user_manages_only_itself_and_the_keys_it_created(
    team: Team, owner: Any
) -> None:
    owners_key = api_key_create(team=team, scopes=["read"], user=owner).api_key
    sibling = api_key_create(team=team, scopes=["read"]).api_key
    issued = api_key_create(team=team, scopes=["chat", "read", "ingest", "keys"])
    team_key = client_for(issued.secret)
    refused = team_key.post("/api/v1/keys", {"scopes": ["ingest"]}, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "scope_missing"
    created = team_key.post("/api/v1/keys", {"scopes": ["chat"]}, format="json")
    assert created.status_code == 201 and created.json()["user"] is None

    listed = {k["prefix"] for k in team_key.get("/api/v1/keys").json()["results"]}
    assert listed == {issued.api_key.prefix, created.json()["prefix"]}
    assert team_key.delete(f"/api/v1/keys/{owners_key.prefix}").status_code == 404
    assert team_key.delete(f"/api/v1/keys/{sibling.prefix}").status_code == 404
    assert team_key.delete(f"/api/v1/keys/{created.json()['prefix']}").status_code == 204
    sibling.refresh_from_db()
    assert sibling.revoked_at is None


def test_a_key_whose_user_left_the_team_and_a_user_of_no_team_manage_no_keys(
    team: Team, member: Any, django_user_model: Any
) -> None:
    secret = api_key_create(team=team, scopes=["read"], user=member).secret
    Membership.objects.filter(user=member).delete()
    refused = client_for(secret).get("/api/v1/keys")
    assert refused.status_code == 401  # the key itself stopped working
    assert refused.json()["error"]["code"] == "revoked_api_key"
    loner = django_user_model.objects.create_user("loner", password="a-long-password-1")
    assert session_of(loner).get("/api/v1/keys").status_code == 403


def test_another_teams_key_is_a_404_and_no_caller_is_a_401(owner: Any, other_team: Team) -> None:
    foreign = api_key_create(team=other_team, scopes=["read"]).api_key
    assert session_of(owner).delete(f"/api/v1/keys/{foreign.prefix}").status_code == 404
    foreign.refresh_from_db()
    assert foreign.revoked_at is None
    anonymous = APIClient()
    assert anonymous.get("/api/v1/keys").status_code == 401
    assert anonymous.post("/api/v1/keys", {"scopes": ["read"]}, format="json").status_code == 401
    assert anonymous.delete(f"/api/v1/keys/{foreign.prefix}").status_code == 401


def test_issuing_validates_the_body(owner: Any) -> None:
    client = session_of(owner)
    unknown = client.post("/api/v1/keys", {"scopes": ["admin"]}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "scopes.0"
    empty = client.post("/api/v1/keys", {"scopes": []}, format="json")
    assert empty.status_code == 400
    assert empty.json()["error"]["code"] == "missing_field"


def test_a_session_needs_the_csrf_token_to_issue(owner: Any) -> None:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(owner)
    refused = client.post("/api/v1/keys", {"scopes": ["read"]}, format="json")
    assert refused.status_code == 403
    assert not ApiKey.objects.exists()
