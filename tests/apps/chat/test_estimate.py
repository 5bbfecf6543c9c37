"""``POST /api/v1/estimate``: the prompt tokens a request would send after retrieval and
assembly, its most completion tokens, its cost range, and whether the limits admit it now;
equal to what the answer then records, through the fake tier and once the real one."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import pytest

from apps.accounts.models import Team
from apps.usage.models import Limit, UsageRecord
from tests import factories
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

QUESTIONS = [
    "Where is the pantry key?",
    "What does the pump move, and where to?",
    "Summarise the notes in one line.",
    "¿Dónde está la llave? Réponds en français.",
    "List three facts " + "with detail " * 20,
]


@pytest.fixture
def corpus(team: Team) -> None:
    collection = factories.collection(team=team, name="facts")
    for title, text in [
        ("Pantry", "The spare pantry key hangs behind the blue door."),
        ("Pump", "The pump moves water uphill to the tank on the roof."),
        ("Notes", "Meetings are on Tuesdays. " * 30),
    ]:
        factories.document(collection=collection, title=title, text=text)


def usage_of(frames: list[dict[str, Any]]) -> dict[str, Any]:
    return next(f["data"] for f in frames if f["event"] == "usage")


@pytest.mark.usefixtures("corpus")
def test_the_estimate_is_what_the_native_answer_records(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    conversation = conversation_for(http)
    for question in QUESTIONS:  # each turn adds history the next estimate counts
        body = {"content": question, "max_tokens": 40}
        estimate = http.post("/api/v1/estimate", json={**body, "conversation": conversation})
        assert estimate.status_code == 200, estimate.text
        guess = estimate.json()
        usage = usage_of(ask_stream(http, conversation, **body, cache=False))
        assert guess["prompt_tokens"] == usage["prompt_tokens"], question
        assert (guess["model"], guess["max_completion_tokens"]) == (usage["model"], 40)
        assert guess["admitted"] is True and guess["error"] is None
        assert Decimal(guess["cost_usd"]["min"]) <= Decimal(guess["cost_usd"]["max"])


@pytest.mark.usefixtures("corpus")
def test_the_estimate_of_a_v1_body_is_what_the_completion_records(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    body = {
        "model": "small",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Where is the pantry key?"},
        ],
        "max_tokens": 30,
        "cache": False,
    }
    guess = http.post("/api/v1/estimate", json=body).json()
    completion = http.post("/v1/chat/completions", json=body).json()
    assert guess["prompt_tokens"] == completion["usage"]["prompt_tokens"]


def test_a_limit_that_would_refuse_says_so_and_holds_nothing(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    Limit.objects.create(team=team, daily_tokens=150)  # the prompt is about 65
    conversation = conversation_for(http)
    body = {"content": "Hello there", "top_k": 0, "max_tokens": 100, "conversation": conversation}
    guess = http.post("/api/v1/estimate", json=body).json()
    assert guess["admitted"] is False and guess["error"]["code"] == "team_quota_exceeded"
    body["max_tokens"] = 10
    assert http.post("/api/v1/estimate", json=body).json()["admitted"] is True
    assert not UsageRecord.objects.filter(kind="chat").exists()  # nothing generated
    assert upstream.requests == []
    quota = http.get("/api/v1/quota").json()["limits"][0]["day"]
    assert quota["used"] == 0  # the hold was given back


def test_a_bad_body_is_the_surfaces_400(upstream: FakeUpstream, http: httpx.Client) -> None:
    assert http.post("/api/v1/estimate", json={"content": "Hi"}).status_code == 400
    bad = {"model": "small", "messages": [{"role": "user", "content": "Hi"}], "temperature": 9}
    reply = http.post("/api/v1/estimate", json=bad)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "temperature"


VARIED = [
    *QUESTIONS,
    "Why?",
    "Explain how the pump and the tank work together, step by step, for a new tenant.",
    "Qu'est-ce qui se passe le mardi ?",
    "Wo hängt der Schlüssel? 🔑 Antworte kurz.",
    "def key(): return 'blue door'  # what does this return?",
    "Numbers: 3.14159, 2.71828, 1.41421, 1.61803 — which is the golden ratio?",
    "東京の天気はどうですか？",  # noqa: RUF001 - Japanese punctuation
    "Repeat after me: " + "pantry " * 40,
    "",  # filled below with a long one
    "Tabs\tand\nnewlines\n\n  and   spaces.",
]
VARIED[-2] = "Summarise everything you know about the house " + "and its rooms " * 60
V1_BODIES: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Key?"}],
    [
        {"role": "user", "content": "Where is the key?"},
        {"role": "assistant", "content": "Behind the blue door."},
        {"role": "user", "content": "And the pump?"},
    ],
    [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Parts"}, {"type": "text", "text": "joined"}],
        }
    ],
    [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Tuesday?"}],
]


@pytest.mark.integration
@pytest.mark.usefixtures("corpus")
def test_the_estimate_through_the_real_tier(
    llama_server: str, settings: Any, http: httpx.Client
) -> None:
    """20 varied requests through llama.cpp: 15 turns of one native conversation (its
    history growing), then 5 /v1 bodies; each estimate's prompt is what the answer then
    records (what the tier reports, where it reports usage), and the recorded cost lies
    in the estimate's range."""
    settings.INFERENCE_BASE_URL = llama_server
    settings.INFERENCE_SERVER = "llama.cpp"
    settings.RESPONSE_CACHE_TTL = 0
    conversation = conversation_for(http)
    for question in VARIED:
        body = {"content": question, "max_tokens": 6, "temperature": 0}
        guess = http.post("/api/v1/estimate", json={**body, "conversation": conversation}).json()
        usage = usage_of(ask_stream(http, conversation, **body))
        assert guess["prompt_tokens"] == usage["prompt_tokens"], question
        _within(guess, UsageRecord.objects.order_by("-pk").first())
    for messages in V1_BODIES:
        body = {"model": "small", "messages": messages, "max_tokens": 6, "temperature": 0}
        guess = http.post("/api/v1/estimate", json=body).json()
        completion = http.post("/v1/chat/completions", json=body).json()
        assert guess["prompt_tokens"] == completion["usage"]["prompt_tokens"], messages
        _within(guess, UsageRecord.objects.order_by("-pk").first())
    assert UsageRecord.objects.filter(kind="chat").count() == len(VARIED) + len(V1_BODIES) == 20


def _within(guess: dict[str, Any], row: UsageRecord | None) -> None:
    assert row is not None and row.prompt_tokens == guess["prompt_tokens"]
    low, high = (Decimal(guess["cost_usd"][end]) for end in ("min", "max"))
    assert low <= row.cost_usd <= high
