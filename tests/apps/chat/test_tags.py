"""Purpose tags: named by a request (``tag`` on the native API, ``metadata.tag`` on /v1) or
by its key's default, checked and capped per team before any work, on every ledger row
the request writes (the answer, its query embedding, an ingestion), and grouped by in
``/usage``, ``usage_report`` and the page."""

from __future__ import annotations

from io import StringIO
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from django.utils import timezone

from apps.accounts.models import ApiKey, Team
from apps.accounts.services import api_key_create
from apps.usage.models import UsageRecord, UsageTag
from tests import factories
from tests.apps.chat.conftest import conversation_for
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def ask_native(http: httpx.Client, **body: Any) -> httpx.Response:
    url = f"/api/v1/conversations/{conversation_for(http)}/messages"
    return http.post(url, json={"content": "Say hello", **body})


def ask_v1(http: httpx.Client, **body: Any) -> httpx.Response:
    payload = {"model": "small", "messages": [{"role": "user", "content": "Say hello"}]}
    return http.post("/v1/chat/completions", json={**payload, **body})


def test_a_requests_tag_is_on_its_answer_and_its_query_embedding(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    collection = factories.collection(team=team, name="facts")
    factories.document(collection=collection, title="Pantry", text="The key is behind the door.")
    assert ask_native(http, tag="support-bot").status_code == 201
    assert ask_v1(http, metadata={"tag": "eval.2026-12"}).status_code == 200
    rows = UsageRecord.objects.filter(operation__in=["answer", "query"]).order_by("pk")
    assert {(row.operation, row.tag) for row in rows} == {
        ("query", "support-bot"),
        ("answer", "support-bot"),
        ("query", "eval.2026-12"),
        ("answer", "eval.2026-12"),
    }
    report = http.get("/api/v1/usage", params={"group_by": "tag"}).json()
    groups = {row["group"]: row["requests"] for row in report["data"]}
    assert groups["support-bot"] == 2 and groups["eval.2026-12"] == 2


def test_a_keys_default_tag_applies_unless_the_request_names_one(
    upstream: FakeUpstream, asgi_server: str, team: Team
) -> None:
    issued = api_key_create(team=team, name="batch", tag="nightly")
    headers = {"Authorization": f"Bearer {issued.secret}"}
    with httpx.Client(base_url=asgi_server, headers=headers, timeout=30) as http:
        assert ask_v1(http, rag={"enabled": False}).status_code == 200
        assert ask_v1(http, rag={"enabled": False}, metadata={"tag": "adhoc"}).status_code == 200
    tags = list(UsageRecord.objects.order_by("pk").values_list("tag", flat=True))
    assert tags == ["nightly", "adhoc"]


@pytest.mark.parametrize(
    ("surface", "body", "param"),
    [
        ("native", {"tag": "Not A Slug"}, "tag"),
        ("native", {"tag": "x" * 33}, "tag"),
        ("v1", {"metadata": {"tag": "-leading"}}, "metadata"),
    ],
)
def test_a_malformed_tag_is_a_400_before_any_work(
    upstream: FakeUpstream, http: httpx.Client, surface: str, body: dict[str, Any], param: str
) -> None:
    reply = ask_native(http, **body) if surface == "native" else ask_v1(http, **body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_value" and error["param"].startswith(param)
    assert upstream.requests == [] and not UsageRecord.objects.exists()


def test_past_the_teams_cap_a_new_tag_is_refused_and_others_are_not(
    upstream: FakeUpstream, http: httpx.Client, settings: Any, other_team: Team, asgi_server: str
) -> None:
    settings.USAGE_TAGS_MAX_PER_TEAM = 2
    for tag in ("a", "b", "a"):
        assert ask_native(http, tag=tag, top_k=0).status_code == 201
    refused = ask_native(http, tag="c", top_k=0)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "too_many_tags"
    assert len(upstream.requests) == 3
    rival = api_key_create(team=other_team, name="rival")
    headers = {"Authorization": f"Bearer {rival.secret}"}
    with httpx.Client(base_url=asgi_server, headers=headers, timeout=30) as other:
        assert ask_native(other, tag="c", top_k=0).status_code == 201  # its own cap
    assert UsageTag.objects.filter(team=other_team).count() == 1


def test_a_tag_deleted_in_the_admin_counts_against_the_cap_again(
    upstream: FakeUpstream, http: httpx.Client, settings: Any, team: Team
) -> None:
    """This process forgets the tags it admitted when a tag row goes: a tag used again
    after its row was deleted is recorded (and counted) anew."""
    settings.USAGE_TAGS_MAX_PER_TEAM = 1
    assert ask_native(http, tag="a", top_k=0).status_code == 201
    UsageTag.objects.filter(team=team, name="a").delete()
    assert ask_native(http, tag="b", top_k=0).status_code == 201
    refused = ask_native(http, tag="a", top_k=0)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "too_many_tags"
    assert list(UsageTag.objects.filter(team=team).values_list("name", flat=True)) == ["b"]


def test_an_upload_with_a_tagged_key_charges_its_ingestion_under_the_tag(
    team: Team, asgi_server: str, settings: Any
) -> None:
    collection = factories.collection(team=team, name="handbook")
    issued = api_key_create(team=team, name="ingest", tag="handbook-sync")
    headers = {"Authorization": f"Bearer {issued.secret}"}
    with httpx.Client(base_url=asgi_server, headers=headers, timeout=30) as http:
        reply = http.post(
            f"/api/v1/collections/{collection.pk}/documents",
            json={"title": "Notes", "text": "Tokens are the unit of cost."},
        )
        assert reply.status_code == 202, reply.text
    row = UsageRecord.objects.get(operation="ingest")
    assert row.tag == "handbook-sync" and row.prompt_tokens > 0


def test_keys_are_issued_with_a_tag_and_the_report_groups_by_it(
    upstream: FakeUpstream, http: httpx.Client, team: Team, asgi_server: str
) -> None:
    manager = api_key_create(team=team, name="manager", scopes=["chat", "keys"])
    headers = {"Authorization": f"Bearer {manager.secret}"}
    with httpx.Client(base_url=asgi_server, headers=headers, timeout=30) as keys:
        made = keys.post("/api/v1/keys", json={"name": "ci", "scopes": ["chat"], "tag": "ci"})
        assert made.status_code == 201, made.text
        assert made.json()["tag"] == "ci"
        bad = keys.post("/api/v1/keys", json={"name": "x", "scopes": ["chat"], "tag": "A B"})
        assert bad.status_code == 400
    assert ApiKey.objects.get(prefix=made.json()["prefix"]).tag == "ci"
    ask_native(http, tag="report-me", top_k=0)
    out = StringIO()
    today = timezone.localdate().isoformat()
    call_command(
        "usage_report", "--team", team.name, "--since", today, "--group-by", "tag", stdout=out
    )
    assert "report-me" in out.getvalue()
    key_out = StringIO()
    call_command("createapikey", team=team.name, tag="nightly", stdout=key_out)
    assert ApiKey.objects.filter(tag="nightly").exists()
