"""``mode`` and ``filters`` on answers: messages and the OpenAI surface's ``rag``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from apps.accounts.models import Team
from apps.usage.models import UsageRecord
from tests import factories
from tests.apps.chat.conftest import conversation_for
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shelves(team: Team) -> dict[str, int]:
    collection = factories.collection(team=team, name="shelves")
    return {
        title: factories.document(collection=collection, title=title, text=text).pk
        for title, text in (
            ("Pantry", "The spare pantry key hangs behind the blue door."),
            ("Garage", "The spare garage key hangs behind the blue door too."),
        )
    }


def query_charges() -> int:
    return UsageRecord.objects.filter(operation="query").count()


def ask(http: httpx.Client, **body: Any) -> dict[str, Any]:
    response = http.post(f"/api/v1/conversations/{conversation_for(http)}/messages", json=body)
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def complete(http: httpx.Client, **rag: Any) -> dict[str, Any]:
    body = {"model": "small", "messages": [{"role": "user", "content": "Where is the spare key?"}]}
    response = http.post("/v1/chat/completions", json={**body, "rag": rag})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_messages_take_filters_and_mode(
    upstream: FakeUpstream, http: httpx.Client, shelves: dict[str, int]
) -> None:
    both = ask(http, content="Where is the spare key?")
    assert {c["title"] for c in both["citations"]} == {"Pantry", "Garage"}  # hybrid default
    charged = query_charges()
    answer = ask(
        http,
        content="Where is the spare key?",
        mode="keyword",
        filters={"document_ids": [shelves["Garage"]]},
    )
    assert [c["title"] for c in answer["citations"]] == ["Garage"]
    assert query_charges() == charged  # keyword search embeds nothing
    answer = ask(
        http, content="Where is the spare key?", mode="dense", filters={"titles": ["Pantry"]}
    )
    assert [c["title"] for c in answer["citations"]] == ["Pantry"]
    assert query_charges() == charged + 1


def test_openai_rag_takes_mode_and_filters(
    upstream: FakeUpstream, http: httpx.Client, shelves: dict[str, int]
) -> None:
    charged = query_charges()
    completion = complete(http, mode="keyword", filters={"titles": ["Pantry"]})
    assert [c["title"] for c in completion["citations"]] == ["Pantry"]
    assert query_charges() == charged
    completion = complete(http, filters={"document_ids": [shelves["Garage"]]})
    assert [c["title"] for c in completion["citations"]] == ["Garage"]
    assert query_charges() == charged + 1  # hybrid, the default, embeds the question


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("messages", {"content": "hi", "mode": "semantic"}, "mode"),
        ("messages", {"content": "hi", "filters": {"title": ["x"]}}, "filters.title"),
        ("completions", {"rag": {"mode": "bm25"}}, "rag.mode"),
        ("completions", {"rag": {"filters": {"titles": []}}}, "rag.filters.titles"),
    ],
)
def test_bad_mode_or_filters_are_400_before_anything_runs(
    upstream: FakeUpstream, http: httpx.Client, path: str, body: dict[str, Any], param: str
) -> None:
    if path == "messages":
        url = f"/api/v1/conversations/{conversation_for(http)}/messages"
    else:
        url = "/v1/chat/completions"
        body = {"model": "small", "messages": [{"role": "user", "content": "hi"}], **body}
    response = http.post(url, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_value", param)
    assert upstream.requests == []


def test_a_long_question_searches_keywords_by_its_first_distinct_terms(
    upstream: FakeUpstream, http: httpx.Client, shelves: dict[str, int]
) -> None:
    """A chat question goes to BM25 as search does: each distinct term once, the first
    ``KEYWORD_MAX_QUERY_TERMS`` (64) only."""
    filler = " ".join(f"filler{n}" for n in range(100))
    late = ask(http, content=f"{filler} pantry " + "filler0 " * 2000, mode="keyword")
    assert late["citations"] == []
    early = ask(http, content=f"pantry {filler}", mode="keyword")
    assert [c["title"] for c in early["citations"]] == ["Pantry"]
