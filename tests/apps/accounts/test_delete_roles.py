"""Roles for destruction: owners and admins delete collections, and any document and
conversation of the team; a member deletes only the documents they uploaded and the
conversations they started; a key of no user acts as a member. A refusal is 403
``role_forbidden`` in the API's error shape, and deletes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Membership, Team
from apps.accounts.services import api_key_create, membership_add
from apps.chat.models import Conversation
from apps.knowledge.models import Collection, Document
from tests import factories
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

ROLES = [Membership.Role.OWNER, Membership.Role.ADMIN, Membership.Role.MEMBER]


@pytest.fixture
def users(team: Team, django_user_model: Any) -> dict[str, Any]:
    made = {}
    for role in [*ROLES, "member-2"]:
        user = django_user_model.objects.create_user(f"{role}-user", password="long-password-1")
        membership_add(team=team, user=user, role=role.removesuffix("-2"))
        made[role] = user
    return made


def session_of(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def assert_role_forbidden(response: Any) -> None:
    assert response.status_code == 403, response.content
    body = response.json()
    assert body == {
        "error": {
            "type": "permission_error",
            "code": "role_forbidden",
            "message": body["error"]["message"],
            "param": None,
        }
    }
    assert body["error"]["message"].startswith("Only the team's owners and admins")


@pytest.mark.parametrize("role", ROLES)
def test_only_owners_and_admins_delete_collections_and_documents_of_no_uploader(
    role: str, team: Team, users: dict[str, Any]
) -> None:
    collection = factories.collection(team=team)
    # As the ``ingest`` command makes them: no member uploaded it.
    document = factories.document(collection=collection, title="Plan", text="The plan.")
    client = session_of(users[role])
    may = role != Membership.Role.MEMBER

    deleted = client.delete(f"/api/v1/documents/{document.pk}")
    if may:
        assert deleted.status_code == 204
    else:
        assert_role_forbidden(deleted)
    assert Document.objects.filter(pk=document.pk).exists() is not may

    deleted = client.delete(f"/api/v1/collections/{collection.pk}")
    if may:
        assert deleted.status_code == 204
    else:
        assert_role_forbidden(deleted)
    assert Collection.objects.filter(pk=collection.pk).exists() is not may


def test_a_key_of_no_user_deletes_no_collection_an_owners_key_does(
    team: Team, users: dict[str, Any], other_team: Team
) -> None:
    collection = factories.collection(team=team)
    team_key = client_for(api_key_create(team=team, scopes=["read", "ingest"]).secret)
    assert_role_forbidden(team_key.delete(f"/api/v1/collections/{collection.pk}"))
    # Another team's owner gets a 404, as for a missing collection: no role is checked.
    outsider = api_key_create(team=other_team, scopes=["ingest"])
    assert (
        client_for(outsider.secret).delete(f"/api/v1/collections/{collection.pk}").status_code
        == 404
    )
    owners_key = api_key_create(team=team, scopes=["ingest"], user=users["owner"])
    assert (
        client_for(owners_key.secret).delete(f"/api/v1/collections/{collection.pk}").status_code
        == 204
    )


def test_members_delete_only_their_own_conversations(team: Team, users: dict[str, Any]) -> None:
    member, teammate = users["member"], users["member-2"]
    members_key = client_for(api_key_create(team=team, scopes=["chat"], user=member).secret)
    team_key, sibling_key = (
        client_for(api_key_create(team=team, scopes=["chat"]).secret) for _ in range(2)
    )

    def start(client: APIClient) -> int:
        created = client.post("/api/v1/conversations", {"title": "t"}, format="json")
        assert created.status_code == 201
        return int(created.json()["id"])

    by_session, by_key, by_team_key = start(session_of(member)), start(members_key), start(team_key)

    for conversation in (by_session, by_key, by_team_key):
        assert_role_forbidden(session_of(teammate).delete(f"/api/v1/conversations/{conversation}"))
    assert_role_forbidden(sibling_key.delete(f"/api/v1/conversations/{by_team_key}"))
    assert_role_forbidden(team_key.delete(f"/api/v1/conversations/{by_session}"))
    assert Conversation.objects.count() == 3

    # Their own: by the same user, signed in or with any of their keys; a key of no user's.
    assert members_key.delete(f"/api/v1/conversations/{by_session}").status_code == 204
    assert session_of(member).delete(f"/api/v1/conversations/{by_key}").status_code == 204
    assert team_key.delete(f"/api/v1/conversations/{by_team_key}").status_code == 204
    # Owners and admins delete any of the team's.
    for role in (Membership.Role.OWNER, Membership.Role.ADMIN):
        conversation = start(session_of(member))
        assert (
            session_of(users[role]).delete(f"/api/v1/conversations/{conversation}").status_code
            == 204
        )
    assert not Conversation.objects.exists()


def test_members_delete_only_the_documents_they_uploaded(team: Team, users: dict[str, Any]) -> None:
    member, teammate = users["member"], users["member-2"]
    collection = factories.collection(team=team)
    members_key = client_for(api_key_create(team=team, scopes=["ingest"], user=member).secret)
    team_key, sibling_key = (
        client_for(api_key_create(team=team, scopes=["ingest"]).secret) for _ in range(2)
    )

    def upload(client: APIClient, text: str, *, code: int = 202) -> int:
        created = client.post(
            f"/api/v1/collections/{collection.pk}/documents",
            {"title": "t", "text": text},
            format="json",
        )
        assert created.status_code == code, created.content
        return int(created.json()["id"])

    by_session = upload(session_of(member), "By session.")
    by_key = upload(members_key, "By key.")
    by_team_key = upload(team_key, "By team key.")
    assert Document.objects.get(pk=by_key).user_id == member.pk
    # Uploading the same content again answers the first document and does not make it
    # the second uploader's.
    assert upload(session_of(teammate), "By session.", code=200) == by_session
    assert upload(sibling_key, "By team key.", code=200) == by_team_key

    for document in (by_session, by_key, by_team_key):
        assert_role_forbidden(session_of(teammate).delete(f"/api/v1/documents/{document}"))
    assert_role_forbidden(sibling_key.delete(f"/api/v1/documents/{by_team_key}"))
    assert_role_forbidden(team_key.delete(f"/api/v1/documents/{by_session}"))
    assert Document.objects.count() == 3

    # Their own: by the same user, signed in or with any of their keys; a key of no user's.
    assert members_key.delete(f"/api/v1/documents/{by_session}").status_code == 204
    assert session_of(member).delete(f"/api/v1/documents/{by_key}").status_code == 204
    assert team_key.delete(f"/api/v1/documents/{by_team_key}").status_code == 204
    assert not Document.objects.exists()
    # Owners and admins delete any of the team's.
    for role in (Membership.Role.OWNER, Membership.Role.ADMIN):
        document = upload(session_of(member), f"For the {role}.")
        assert session_of(users[role]).delete(f"/api/v1/documents/{document}").status_code == 204
    assert not Document.objects.exists()
