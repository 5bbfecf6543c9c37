import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from apps.accounts.models import ApiKey, Team
from apps.accounts.services import IssuedKey, api_key_create, api_key_revoke, hash_secret
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def error_of(response: object) -> dict[str, object]:
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"}
    assert set(body["error"]) == {"type", "code", "message", "param"}
    return body["error"]  # type: ignore[no-any-return]


def test_key_is_stored_hashed_with_a_public_prefix(issued_key: IssuedKey) -> None:
    stored = ApiKey.objects.get(pk=issued_key.api_key.pk)
    assert issued_key.secret.startswith(f"rt_{stored.prefix}_")
    assert stored.secret_hash == hash_secret(issued_key.secret)
    assert issued_key.secret not in str(ApiKey.objects.values().get(pk=stored.pk))


def test_missing_invalid_and_revoked_keys_are_401(issued_key: IssuedKey) -> None:
    response = APIClient().get("/api/v1/collections")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert error_of(response)["code"] == "missing_api_key"

    wrong = issued_key.secret[:-4] + "AAAA"
    response = client_for(wrong).get("/api/v1/collections")
    assert (response.status_code, error_of(response)["code"]) == (401, "invalid_api_key")
    response = client_for("garbage").get("/api/v1/collections")
    assert (response.status_code, error_of(response)["code"]) == (401, "invalid_api_key")

    api_key_revoke(api_key=issued_key.api_key)
    response = client_for(issued_key.secret).get("/api/v1/collections")
    assert (response.status_code, error_of(response)["code"]) == (401, "revoked_api_key")
    assert error_of(response)["type"] == "authentication_error"


def test_scopes_are_enforced(team: Team) -> None:
    reader = client_for(api_key_create(team=team, scopes=["read"]).secret)
    assert reader.get("/api/v1/collections").status_code == 200
    response = reader.post("/api/v1/collections", {"name": "x"}, format="json")
    assert response.status_code == 403
    assert error_of(response) == {
        "type": "permission_error",
        "code": "scope_missing",
        "message": "This API key lacks the 'ingest' scope.",
        "param": None,
    }
    chat_only = client_for(api_key_create(team=team, scopes=["chat"]).secret)
    response = chat_only.post("/api/v1/search", {"query": "x"}, format="json")
    assert (response.status_code, error_of(response)["code"]) == (403, "scope_missing")


def test_last_used_is_recorded(api: APIClient, issued_key: IssuedKey) -> None:
    assert issued_key.api_key.last_used_at is None
    api.get("/api/v1/collections")
    issued_key.api_key.refresh_from_db()
    assert issued_key.api_key.last_used_at is not None


def test_session_user_acts_for_their_team_and_needs_csrf(team: Team, django_user_model) -> None:  # type: ignore[no-untyped-def]
    user = django_user_model.objects.create_user("ann", password="pw-long-enough")
    team.memberships.create(user=user)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get("/api/v1/collections").status_code == 200
    response = client.post("/api/v1/collections", {"name": "x"}, format="json")
    assert response.status_code == 403  # no CSRF token

    loner = django_user_model.objects.create_user("bob", password="pw-long-enough")
    client.force_login(loner)
    response = client.get("/api/v1/collections")
    assert (response.status_code, error_of(response)["code"]) == (403, "no_team")


def test_createteam_and_createapikey_commands(db: None) -> None:
    call_command("createteam", "initech", stderr=StringIO())
    out = StringIO()
    call_command(
        "createapikey", "--team", "initech", "--scopes", "read", "--name", "ci", stdout=out
    )
    secret = out.getvalue().strip()
    assert secret.startswith("rt_") and "\n" not in secret
    key = ApiKey.objects.get(name="ci")
    assert key.scopes == ["read"] and key.team.name == "initech"
    assert client_for(secret).get("/api/v1/collections").status_code == 200
    with pytest.raises(CommandError):
        call_command("createapikey", "--team", "nope", stdout=StringIO())
    with pytest.raises(CommandError):
        call_command("createteam", "initech", stderr=StringIO())


def test_admin_shows_a_new_key_once_on_its_own_page_never_in_a_cookie(
    admin_client, team: Team
) -> None:  # type: ignore[no-untyped-def]
    response = admin_client.post(
        "/admin/accounts/apikey/add/",
        {"team": team.pk, "name": "from-admin", "scopes": ["read"], "user": ""},
    )
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    key = ApiKey.objects.get(name="from-admin")
    secret = re.search(r"rt_[0-9a-f]+_[\w-]+", response.content.decode())
    assert secret is not None and key.secret_hash == hash_secret(secret.group())
    assert key.scopes == ["read"]
    # Nothing carries it on: no cookie, and the next page shows no message with it.
    assert all("rt_" not in morsel.value for morsel in response.cookies.values())
    assert "rt_" not in admin_client.get("/admin/accounts/apikey/").content.decode()
    assert client_for(secret.group()).get("/api/v1/collections").status_code == 200


def test_admin_refuses_a_key_of_no_scope(admin_client, team: Team) -> None:  # type: ignore[no-untyped-def]
    # JSON that is no list of scopes (false, 0) once read as "every scope".
    for scopes in ([], "[]", "false", "0"):
        response = admin_client.post(
            "/admin/accounts/apikey/add/",
            {"team": team.pk, "name": "empty", "scopes": scopes, "user": ""},
        )
        assert response.status_code == 200
        assert response.context["adminform"].form.errors["scopes"]
    assert not ApiKey.objects.exists()
