"""A leaked key reaches no further than it must: managing keys needs the ``keys`` scope,
only owners and admins grant it, a key manages only the keys it created unless its user
is an owner or admin, revoking a key revokes the keys it created, and usage by key shows a
member only their own keys."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiKey, Team
from apps.accounts.selectors import api_key_cache
from apps.accounts.services import api_key_create
from apps.core.models import AuditEvent
from apps.usage.models import UsageRecord
from tests.apps.accounts.conftest import session_of
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def code_of(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_a_leaked_read_only_key_lists_mints_and_revokes_nothing(
    team: Team, owner: Any, member: Any
) -> None:
    leaked = client_for(api_key_create(team=team, scopes=["read", "chat"], user=owner).secret)
    teammates = api_key_create(team=team, scopes=["chat"], user=member).api_key

    assert code_of(leaked.get("/api/v1/keys")) == (403, "scope_missing")
    assert code_of(leaked.post("/api/v1/keys", {"scopes": ["read"]}, format="json")) == (
        403,
        "scope_missing",
    )
    assert code_of(leaked.delete(f"/api/v1/keys/{teammates.prefix}")) == (403, "scope_missing")
    limits = {"tokens_per_minute": None}
    assert code_of(
        leaked.put(f"/api/v1/keys/{teammates.prefix}/limits", limits, format="json")
    ) == (403, "scope_missing")
    teammates.refresh_from_db()
    assert teammates.revoked_at is None
    assert ApiKey.objects.filter(team=team).count() == 2
    assert not AuditEvent.objects.filter(action=AuditEvent.Action.KEY_REVOKED).exists()


def test_only_owners_and_admins_grant_the_keys_scope(owner: Any, member: Any) -> None:
    refused = session_of(member).post("/api/v1/keys", {"scopes": ["keys"]}, format="json")
    assert code_of(refused) == (403, "scope_missing")
    granted = session_of(owner).post("/api/v1/keys", {"scopes": ["keys"]}, format="json")
    assert granted.status_code == 201 and granted.json()["scopes"] == ["keys"]
    # A member's session still manages the member's own keys.
    assert session_of(member).get("/api/v1/keys").status_code == 200


def test_a_members_key_manages_only_the_keys_it_created(
    team: Team, member: Any, owner: Any
) -> None:
    # A member's key that carries ``keys`` (granted while they were an admin).
    issuer = api_key_create(team=team, scopes=["chat", "read", "keys"], user=member)
    own_other = api_key_create(team=team, scopes=["read"], user=member).api_key
    owners = api_key_create(team=team, scopes=["read"], user=owner).api_key
    with_key = client_for(issuer.secret)
    child = with_key.post("/api/v1/keys", {"scopes": ["read"]}, format="json").json()

    listed = {key["prefix"] for key in with_key.get("/api/v1/keys").json()["results"]}
    assert listed == {issuer.api_key.prefix, child["prefix"]}
    for untouchable in (own_other, owners):
        assert with_key.delete(f"/api/v1/keys/{untouchable.prefix}").status_code == 404
        untouchable.refresh_from_db()
        assert untouchable.revoked_at is None

    # An owner's key with ``keys`` manages every key of the team.
    owners_key = client_for(api_key_create(team=team, scopes=["keys"], user=owner).secret)
    every = {key["prefix"] for key in owners_key.get("/api/v1/keys").json()["results"]}
    assert {own_other.prefix, owners.prefix, child["prefix"]} <= every
    assert owners_key.delete(f"/api/v1/keys/{own_other.prefix}").status_code == 204


def test_revoking_a_key_revokes_the_keys_it_created_transitively(
    team: Team, owner: Any, other_team: Team
) -> None:
    root = api_key_create(team=team, scopes=["read", "keys"], user=owner)
    child = client_for(root.secret).post(
        "/api/v1/keys", {"scopes": ["read", "keys"]}, format="json"
    )
    grandchild = client_for(child.json()["key"]).post(
        "/api/v1/keys", {"scopes": ["read"]}, format="json"
    )
    sibling = api_key_create(team=team, scopes=["read"], user=owner)
    foreign = api_key_create(team=other_team, scopes=["read"])

    assert session_of(owner).delete(f"/api/v1/keys/{root.api_key.prefix}").status_code == 204

    for secret in (root.secret, child.json()["key"], grandchild.json()["key"]):
        refused = client_for(secret).get("/api/v1/collections")
        assert code_of(refused) == (401, "revoked_api_key")
    for alive in (sibling.secret, foreign.secret):
        assert client_for(alive).get("/api/v1/collections").status_code == 200
    revoked = AuditEvent.objects.filter(action=AuditEvent.Action.KEY_REVOKED)
    assert {(event.target, event.detail.get("with")) for event in revoked} == {
        (f"key {root.api_key.prefix}", None),
        (f"key {child.json()['prefix']}", root.api_key.prefix),
        (f"key {grandchild.json()['prefix']}", child.json()["prefix"]),
    }


def test_a_revoked_key_issues_nothing_through_a_stale_cached_copy(
    team: Team, owner: Any, settings: Any
) -> None:
    settings.API_KEY_CACHE_SECONDS = 60
    api_key_cache().clear()
    parent = api_key_create(team=team, scopes=["read", "keys"], user=owner)
    with_key = client_for(parent.secret)
    assert with_key.get("/api/v1/keys").status_code == 200  # cached, live
    # Revoked by another process: this one still holds the live copy.
    ApiKey.objects.filter(pk=parent.api_key.pk).update(revoked_at=timezone.now())

    refused = with_key.post("/api/v1/keys", {"scopes": ["read"]}, format="json")
    assert code_of(refused) == (401, "revoked_api_key")
    assert ApiKey.objects.filter(team=team).count() == 1
    api_key_cache().clear()


def usage_row(team: Team, api_key: ApiKey | None, tokens: int) -> None:
    UsageRecord.objects.create(
        team=team, api_key=api_key, kind="chat", model="small", operation="query",
        prompt_tokens=tokens,
    )  # fmt: skip


def test_usage_by_key_shows_a_member_only_their_own_keys(
    team: Team, owner: Any, member: Any, other_team: Team
) -> None:
    mine = api_key_create(team=team, scopes=["read"], user=member).api_key
    owners = api_key_create(team=team, scopes=["read"], user=owner)
    team_key = api_key_create(team=team, scopes=["read"])
    foreign = api_key_create(team=other_team, scopes=["read"]).api_key
    usage_row(team, mine, 10)
    usage_row(team, owners.api_key, 20)
    usage_row(team, team_key.api_key, 40)
    usage_row(team, None, 80)
    usage_row(other_team, foreign, 160)

    def by_key(client: APIClient) -> tuple[dict[str | None, int], int]:
        report = client.get("/api/v1/usage", {"group_by": "key"}).json()
        rows = {row["group"]: row["prompt_tokens"] for row in report["data"]}
        return rows, report["total"]["prompt_tokens"]

    assert by_key(session_of(member)) == ({mine.prefix: 10}, 10)
    assert by_key(client_for(team_key.secret)) == ({team_key.api_key.prefix: 40}, 40)
    every = {mine.prefix: 10, owners.api_key.prefix: 20, team_key.api_key.prefix: 40, None: 80}
    assert by_key(session_of(owner)) == (every, 150)
    assert by_key(client_for(owners.secret)) == (every, 150)
    # Other groupings name no key: the team's totals, as before.
    by_day = session_of(member).get("/api/v1/usage", {"group_by": "day"}).json()
    assert by_day["total"]["prompt_tokens"] == 150
