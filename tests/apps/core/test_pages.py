"""The browser pages as HTML (the browser tests drive them in Chromium): who sees what,
what the server renders into them, and no inline script anywhere."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from apps.accounts.models import Membership, Team
from tests import factories

pytestmark = pytest.mark.django_db

PAGES = ["/", "/usage", "/keys"]


@pytest.fixture
def signed_in(team: Team, django_user_model: Any) -> Any:
    def make(role: str = Membership.Role.MEMBER) -> Client:
        user = django_user_model.objects.create_user(f"u-{role}", password="a-long-password-1")
        team.memberships.create(user=user, role=role)
        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.mark.parametrize("path", PAGES)
def test_pages_need_a_sign_in(path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/login")


@pytest.mark.parametrize("path", PAGES)
def test_pages_link_each_other_and_carry_no_inline_script(path: str, signed_in: Any) -> None:
    response = signed_in().get(path)
    assert response.status_code == 200
    html = response.content.decode()
    assert '<a href="/usage"' in html and ">Usage</a>" in html
    assert '<a href="/keys"' in html and ">API keys</a>" in html
    assert not re.search(r"<script(?![^>]*\bsrc=)", html)
    assert not re.search(r"\son[a-z]+=", html)
    assert "script-src 'self';" in response["Content-Security-Policy"]
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"


def test_the_chat_page_offers_upload_limits_models_and_collections(
    signed_in: Any, team: Team, settings: Any
) -> None:
    settings.MAX_UPLOAD_BYTES = 1234
    factories.collection(team=team, name="handbook")
    html = signed_in().get("/").content.decode()
    assert 'data-max-bytes="1234"' in html
    assert 'accept=".htm,.html,.markdown,.md,.pdf,.text,.txt"' in html
    assert ">handbook</option>" in html
    assert re.search(r'<option value="auto"', html)
    assert 'aria-label="Conversations"' in html
    assert re.findall(r'<option value="(\w+)">\1</option>', html.split('id="mode"')[1]) == [
        "hybrid",
        "dense",
        "keyword",
    ]


def test_the_keys_page_offers_the_scopes_of_the_role(signed_in: Any) -> None:
    member = signed_in(Membership.Role.MEMBER).get("/keys").content.decode()
    assert re.search(r'value="ingest" disabled', member)
    owner = signed_in(Membership.Role.OWNER).get("/keys").content.decode()
    assert 'value="ingest" disabled' not in owner and 'value="ingest"' in owner


def test_the_usage_page_draws_the_chart_server_side(signed_in: Any) -> None:
    html = signed_in().get("/usage?days=7").content.decode()
    svg = re.search(r'<svg class="usage-chart".*?</svg>', html, re.DOTALL)
    assert svg is not None
    assert 'role="img"' in svg.group(0)
    title = re.search(r'<title id="usage-chart-title">([^<]*)</title>', svg.group(0))
    assert title is not None and "tokens" in title.group(1)
    assert svg.group(0).count('class="bar"') == 7
