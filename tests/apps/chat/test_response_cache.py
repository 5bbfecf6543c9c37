"""The response cache, through the HTTP API against the fake tier on a real socket: a
repeated single-turn question is replayed without calling the tier, charged no generation
tokens, and misses once anything it depends on changed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.services import api_key_create
from apps.chat.response_cache import response_cache_purge, response_cache_ttl
from apps.chat.services import run as run_module
from apps.chat.services.retention import conversations_purge, retention_purge
from apps.core.models import ResponseCacheEntry
from apps.knowledge.models import Collection
from apps.knowledge.services import collection_delete, document_delete
from apps.usage.models import UsageRecord
from tests import factories
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.conftest import reachable_redis_url
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "Where is the pantry key?"


@pytest.fixture(autouse=True)
def _cache_on(settings: Any) -> None:
    settings.RESPONSE_CACHE_TTL = 3600
    settings.RESPONSE_CACHE_REDIS_URL = ""


def seed(team: Team) -> Collection:
    collection = factories.collection(team=team, name="facts")
    factories.document(
        collection=collection, title="Pantry", text="The spare pantry key hangs by the door."
    )
    return collection


def ask(http: httpx.Client, content: str = QUESTION, **body: Any) -> list[dict[str, Any]]:
    """One question in a new conversation (a single turn), streamed."""
    return ask_stream(http, conversation_for(http), content=content, **body)


def usage_of(frames: list[dict[str, Any]]) -> dict[str, Any]:
    return next(f["data"] for f in frames if f["event"] == "usage")


def text_of(frames: list[dict[str, Any]]) -> str:
    return "".join(f["data"]["text"] for f in frames if f["event"] == "delta")


def test_a_repeated_question_is_replayed_without_the_tier(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    seed(team)
    first = ask(http)
    assert usage_of(first)["cache_hit"] is False
    assert len(upstream.requests) == 1

    # Case and whitespace do not matter (the question is case-folded, whitespace collapsed).
    again = ask(http, content="  where IS the   pantry key? ")
    assert len(upstream.requests) == 1  # the tier was not called
    names = [f["event"] for f in again]
    assert names[:2] + names[-2:] == ["message", "retrieval", "usage", "done"]
    assert set(names[2:-2]) == {"delta"}  # as the first answer's deltas were
    assert [int(f["id"]) for f in again] == list(range(1, len(again) + 1))
    assert text_of(again) == text_of(first) == "Hello world."
    assert again[1]["data"]["citations"] == first[1]["data"]["citations"]
    usage = usage_of(again)
    assert usage["cache_hit"] is True
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (0, 0, 0)
    assert usage["ttft_ms"] is not None and usage["queue_ms"] == 0
    assert again[-1]["data"]["finish_reason"] == "stop"

    # The ledger: a chat row flagged cache_hit with no generation tokens, priced at 0; the
    # query embedding is charged as for any search.
    miss, hit = UsageRecord.objects.filter(kind=UsageRecord.Kind.CHAT).order_by("pk")
    assert (miss.cache_hit, hit.cache_hit) == (False, True)
    assert miss.completion_tokens == 3
    assert (hit.prompt_tokens, hit.completion_tokens, hit.cost_usd) == (0, 0, 0)
    assert UsageRecord.objects.filter(operation="query").count() == 2

    # The replayed answer is a message of its conversation like any other.
    conversation = again[0]["data"]["conversation_id"]
    detail = http.get(f"/api/v1/conversations/{conversation}").json()
    assert detail["messages"][-1]["content"] == "Hello world."
    assert detail["messages"][-1]["usage"]["cache_hit"] is True


def test_non_streaming_and_openai_surfaces_hit_too(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    seed(team)
    conversation = conversation_for(http)
    url = f"/api/v1/conversations/{conversation}/messages"
    first = http.post(url, json={"content": QUESTION})
    assert first.status_code == 201 and first.json()["usage"]["cache_hit"] is False
    body = {"content": QUESTION}
    whole = http.post(f"/api/v1/conversations/{conversation_for(http)}/messages", json=body)
    assert whole.status_code == 201
    assert whole.json()["content"] == "Hello world." and whole.json()["usage"]["cache_hit"]

    chat = {"model": "small", "messages": [{"role": "user", "content": QUESTION}]}
    completion = http.post("/v1/chat/completions", json=chat).json()
    assert completion["choices"][0]["message"]["content"] == "Hello world."
    assert completion["usage"]["cache_hit"] is True
    assert completion["usage"]["completion_tokens"] == 0
    with http.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as response:
        streamed = response.read().decode()
    assert '"content":"Hello' in streamed and streamed.rstrip().endswith("data: [DONE]")
    assert len(upstream.requests) == 1


def test_cache_false_skips_it_on_both_surfaces(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    seed(team)
    ask(http)
    assert usage_of(ask(http, cache=False))["cache_hit"] is False
    chat = {"model": "small", "messages": [{"role": "user", "content": QUESTION}]}
    completion = http.post("/v1/chat/completions", json={**chat, "cache": False}).json()
    assert completion["usage"]["cache_hit"] is False
    assert len(upstream.requests) == 3


def test_what_the_answer_depends_on_is_in_the_key(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    seed(team)
    ask(http)
    ask(http, max_tokens=64)
    ask(http, model="large")
    ask(http, mode="keyword")
    ask(http, top_k=2)
    ask(http, content="Where is the pantry key")  # another question
    assert len(upstream.requests) == 6
    assert usage_of(ask(http, mode="keyword"))["cache_hit"] is True


def test_a_follow_up_turn_is_never_cached(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    seed(team)
    ask(http)
    conversation = conversation_for(http)
    ask_stream(http, conversation, content="Hi there")
    follow_up = ask_stream(http, conversation, content=QUESTION)  # history: not single-turn
    assert usage_of(follow_up)["cache_hit"] is False
    assert len(upstream.requests) == 3


def test_ingest_and_delete_change_the_index_version_so_entries_miss(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    collection = seed(team)
    ask(http)
    assert usage_of(ask(http))["cache_hit"] is True
    added = factories.document(collection=collection, title="Cellar", text="Wine is cold.")
    assert usage_of(ask(http))["cache_hit"] is False  # a new index version
    assert usage_of(ask(http))["cache_hit"] is True
    document_delete(document=added)
    assert usage_of(ask(http))["cache_hit"] is False
    assert len(upstream.requests) == 3


def test_deleting_documents_drops_the_teams_cached_answers(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    """Knowledge sits below chat and may not import it: its deletes reach the cache through
    its ``team_documents_deleted`` signal, once they commit."""
    collection = seed(team)
    cellar = factories.document(collection=collection, title="Cellar", text="Wine is cold.")
    ask(http)
    assert ResponseCacheEntry.objects.count() == 1
    document_delete(document=cellar)
    assert not ResponseCacheEntry.objects.exists()
    ask(http)
    assert ResponseCacheEntry.objects.count() == 1
    collection_delete(collection=collection)
    assert not ResponseCacheEntry.objects.exists()


@pytest.mark.parametrize("target", ["document", "collection"])
def test_an_admin_delete_leaves_no_cached_answer_quoting_it(
    upstream: FakeUpstream, http: httpx.Client, team: Team, admin_client: Any, target: str
) -> None:
    """Issue 27, item 9: deleted in Django admin, the document stayed in the index at the
    same version, so the answer quoting it kept being replayed. Another team's cached
    answers are not the deleting team's to lose."""
    collection = seed(team)
    ask(http)
    assert usage_of(ask(http))["cache_hit"] is True
    other = factories.team(name="globex")
    seed(other)
    headers = {"Authorization": f"Bearer {api_key_create(team=other, name='k').secret}"}
    with httpx.Client(base_url=str(http.base_url), headers=headers, timeout=30) as theirs:
        ask(theirs)

        document = collection.documents.get()
        obj = document if target == "document" else collection
        page = admin_client.post(f"/admin/knowledge/{target}/{obj.pk}/delete/", {"post": "yes"})
        assert page.status_code == 302

        assert not ResponseCacheEntry.objects.filter(team=team).exists()
        again = ask(http)
        assert usage_of(again)["cache_hit"] is False
        assert again[1]["data"]["citations"] == []  # nothing left to quote
        assert usage_of(ask(theirs))["cache_hit"] is True
    assert len(upstream.requests) == 3


def test_another_team_never_hits(upstream: FakeUpstream, http: httpx.Client, team: Team) -> None:
    seed(team)
    ask(http)
    other = factories.team(name="globex")
    seed(other)
    headers = {"Authorization": f"Bearer {api_key_create(team=other, name='k').secret}"}
    with httpx.Client(base_url=str(http.base_url), headers=headers, timeout=30) as theirs:
        assert usage_of(ask(theirs))["cache_hit"] is False
    assert len(upstream.requests) == 2


def test_a_hit_takes_no_slot_at_the_tier(
    upstream: FakeUpstream, http: httpx.Client, team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(team)
    ask(http)

    async def no_slot(**kwargs: Any) -> None:
        raise AssertionError("a cache hit asked the fair queue for a slot")

    monkeypatch.setattr(run_module, "slot_acquire", no_slot)
    assert usage_of(ask(http))["cache_hit"] is True


def test_failed_and_cancelled_answers_are_not_cached(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    seed(team)
    upstream.script.drop_after = 1
    assert any(f["event"] == "error" for f in ask(http))
    upstream.script.drop_after = None
    assert usage_of(ask(http))["cache_hit"] is False
    assert usage_of(ask(http))["cache_hit"] is True


def test_entries_are_encrypted_and_purged_with_the_teams_data(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    seed(team)
    frames = ask(http)
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload FROM core_responsecacheentry")
        (raw,) = cursor.fetchone()
    assert "Hello" not in raw and "pantry" not in raw.lower()

    # Deleting a conversation drops the team's cached answers.
    assert http.delete(f"/api/v1/conversations/{frames[0]['data']['conversation_id']}")
    assert not ResponseCacheEntry.objects.exists()

    # Retention: entries written before the cutoff go with the team's messages, and no
    # entry outlives the retention in the first place.
    ask(http)
    assert ResponseCacheEntry.objects.count() == 1
    conversations_purge(team=team, older_than=timezone.now())
    assert not ResponseCacheEntry.objects.exists()
    team.retention_days = 0
    assert response_cache_ttl(team=team) == 0

    # The hourly job also reclaims expired rows of every team (never read, see the TTL).
    ask(http)
    ResponseCacheEntry.objects.update(expires_at=timezone.now())
    assert usage_of(ask(http))["cache_hit"] is False  # expired: a miss, then written anew
    ResponseCacheEntry.objects.update(expires_at=timezone.now())
    retention_purge()
    assert not ResponseCacheEntry.objects.exists()


def test_redis_store_hits_encrypted_and_purges(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    import uuid

    import redis

    settings.RESPONSE_CACHE_REDIS_URL = reachable_redis_url()
    settings.RESPONSE_CACHE_KEY_PREFIX = f"ragtier:test:{uuid.uuid4().hex[:12]}:rcache:"
    seed(team)
    ask(http)
    assert usage_of(ask(http))["cache_hit"] is True
    assert len(upstream.requests) == 1
    assert not ResponseCacheEntry.objects.exists()
    client = redis.Redis.from_url(settings.RESPONSE_CACHE_REDIS_URL)
    try:
        keys = client.keys(f"{settings.RESPONSE_CACHE_KEY_PREFIX}{team.pk}:*")
        assert len(keys) == 1
        assert b"Hello" not in client.get(keys[0])
        assert 0 < client.ttl(keys[0]) <= 3600
        assert response_cache_purge(team_id=team.pk) == 1
        assert not client.keys(f"{settings.RESPONSE_CACHE_KEY_PREFIX}*")
    finally:
        client.close()
    assert usage_of(ask(http))["cache_hit"] is False


def test_cache_off_with_ttl_zero(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    settings.RESPONSE_CACHE_TTL = 0
    seed(team)
    ask(http)
    ask(http)
    assert len(upstream.requests) == 2
    assert not ResponseCacheEntry.objects.exists()
