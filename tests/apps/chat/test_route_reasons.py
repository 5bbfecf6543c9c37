"""Why each answer's alias served (issue 31): the ledger row's ``route_reason``, for every
reason, on the native API and on ``/v1/chat/completions``, through two fake tiers on real
sockets; and a router of one's own, set by dotted path (``ROUTER``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from apps.accounts.models import Team
from apps.chat.services.registry import ModelSpec
from apps.chat.services.routers import (
    Assemble,
    Route,
    RouteReason,
    auto_route,
    route_reason_served,
)
from apps.chat.services.tier import breaker
from apps.usage.models import Limit, UsageRecord
from inference import ChatRequest, ModelEntry, Prompt, Target, TokenizerSpec
from tests import factories
from tests.apps.chat.conftest import conversation_for
from tests.apps.chat.test_routing import Tier
from tests.fake_upstream import FakeUpstream, fake_upstream

pytestmark = pytest.mark.django_db(transaction=True)

SHORT = "Where is the key?"
LONG = "Explain " + "the pantry key and the blue door " * 10
SURFACES = ("native", "openai")


@pytest.fixture
def tier(upstream: FakeUpstream, settings: Any, team: Team) -> Iterator[Tier]:
    """``small`` on upstream ``a``, ``large`` on ``b``; ``auto`` keeps up to 120 prompt
    tokens on ``small`` (the system prompt alone is 60)."""
    with fake_upstream() as second:
        settings.ROUTER_SMALL_MAX_PROMPT_TOKENS = 120
        yield Tier(upstream, second, settings, team.pk)


def both(tier: Tier, small: dict[str, Any] | None = None, **large: Any) -> None:
    tier.register(
        small={"upstreams": [tier.a.base_url], **(small or {})},
        large={"upstreams": [tier.b.base_url], "max_output_tokens": 256, **large},
    )


def ask(http: httpx.Client, surface: str, content: str, **body: Any) -> str:
    """The alias that served ``content`` on ``surface`` (JSON, not streamed)."""
    if surface == "native":
        url = f"/api/v1/conversations/{conversation_for(http)}/messages"
        reply = http.post(url, json={"content": content, "top_k": 0, **body})
        assert reply.status_code == 201, reply.text
        return str(reply.json()["usage"]["model"])
    messages = [{"role": "user", "content": content}]
    rag = {"enabled": "top_k" in body, "top_k": body.pop("top_k", 1)}
    openai_body = {"messages": messages, "rag": rag, "cache": False, **body}
    reply = http.post("/v1/chat/completions", json=openai_body)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["model"])


def reasons() -> list[tuple[str, str]]:
    """(alias that served, why) of each answer in the ledger, oldest first."""
    rows = UsageRecord.objects.filter(kind="chat").order_by("pk")
    return [(row.model, row.route_reason) for row in rows]


@pytest.mark.parametrize("surface", SURFACES)
def test_a_fixed_alias_is_requested(tier: Tier, http: httpx.Client, surface: str) -> None:
    both(tier)
    assert ask(http, surface, LONG, model="small") == "small"
    assert ask(http, surface, SHORT, model="large") == "large"
    assert reasons() == [("small", "requested"), ("large", "requested")]


@pytest.mark.parametrize("surface", SURFACES)
def test_auto_names_the_prompts_length(tier: Tier, http: httpx.Client, surface: str) -> None:
    both(tier)
    assert ask(http, surface, SHORT, model="auto") == "small"
    assert ask(http, surface, LONG, model="auto") == "large"
    assert reasons() == [("small", "prompt_short"), ("large", "prompt_long")]
    assert (len(tier.a.requests), len(tier.b.requests)) == (1, 1)


@pytest.mark.parametrize("surface", SURFACES)
def test_passages_the_small_window_cannot_hold_send_the_answer_large(
    tier: Tier, http: httpx.Client, team: Team, surface: str
) -> None:
    collection = factories.collection(team=team, name="facts")
    for number in range(6):
        text = f"Fact {number} about the pantry key. " + "filler words here " * 40
        factories.document(collection=collection, title=f"Fact {number}", text=text)
    tier.settings.ROUTER_SMALL_MAX_PROMPT_TOKENS = 10_000  # short, whatever it holds
    both(tier, small={"context_window": 420, "max_output_tokens": 20})
    assert ask(http, surface, "Where is the pantry key?", model="auto", top_k=5) == "large"
    assert reasons() == [("large", "passages_dropped")]
    assert tier.a.requests == []
    sent = str(tier.b.requests[0]["messages"])
    assert sum(f"Fact {number} about" in sent for number in range(6)) == 5  # all it found


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize(
    ("allowed", "content", "served"),
    [(["large"], SHORT, "large"), (["small"], LONG, "small")],
    ids=["small-forbidden", "large-forbidden"],
)
def test_auto_passed_over_an_alias_the_allow_list_forbids(
    tier: Tier,
    http: httpx.Client,
    team: Team,
    surface: str,
    allowed: list[str],
    content: str,
    served: str,
) -> None:
    both(tier)
    Limit.objects.create(team=team, allowed_models=allowed)
    assert ask(http, surface, content, model="auto") == served
    assert reasons() == [(served, "allow_list")]


@pytest.mark.parametrize("surface", SURFACES)
def test_more_max_tokens_than_small_writes_is_the_reason(
    tier: Tier, http: httpx.Client, surface: str
) -> None:
    both(tier, small={"max_output_tokens": 32})
    assert ask(http, surface, SHORT, model="auto", max_tokens=100) == "large"
    assert reasons() == [("large", "max_tokens")]


@pytest.mark.parametrize("surface", SURFACES)
def test_a_field_small_cannot_honour_is_the_reason(
    tier: Tier, http: httpx.Client, surface: str
) -> None:
    both(tier, small={"unsupported": ["seed"]})
    assert ask(http, surface, SHORT, model="auto", seed=7) == "large"
    assert ask(http, surface, SHORT + " Again?", model="auto") == "small"
    assert reasons() == [("large", "unsupported_field"), ("small", "prompt_short")]


@pytest.mark.parametrize("surface", SURFACES)
def test_a_window_too_small_for_the_bare_prompt_is_the_reason(
    tier: Tier, http: httpx.Client, surface: str
) -> None:
    both(tier, small={"context_window": 90, "max_output_tokens": 32})
    assert ask(http, surface, SHORT, model="auto") == "large"
    assert reasons() == [("large", "window")]
    assert tier.a.requests == []


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("model", ["small", "auto"])
def test_a_failed_upstream_makes_it_a_fallback(
    tier: Tier, http: httpx.Client, surface: str, model: str
) -> None:
    both(tier, small={"fallback": "large"})
    tier.a.script.fail_status, tier.a.script.fail_times = 502, 100
    assert ask(http, surface, SHORT, model=model) == "large"
    assert reasons() == [("large", "fallback")]  # over "requested" and "prompt_short"
    assert len(tier.a.requests) == 1


@pytest.mark.parametrize("surface", SURFACES)
def test_an_open_circuit_makes_it_the_breaker(tier: Tier, http: httpx.Client, surface: str) -> None:
    tier.settings.INFERENCE_BREAKER_FAILURES = 1
    both(tier, small={"fallback": "large"})

    async def fail() -> None:  # the breaker (and its Redis client) belong to a loop
        await breaker().failure(tier.a.base_url)

    async_to_sync(fail)()
    assert ask(http, surface, SHORT, model="small") == "large"
    assert reasons() == [("large", "breaker")]
    assert tier.a.requests == []  # skipped, never tried


def test_streamed_answers_record_the_reason_too(tier: Tier, http: httpx.Client) -> None:
    from tests.apps.chat.conftest import ask_stream

    both(tier)
    frames = ask_stream(http, conversation_for(http), content=LONG, model="auto", top_k=0)
    assert frames[-1]["event"] == "done"
    assert reasons() == [("large", "prompt_long")]


class LastCandidate:
    """A router of one's own: always the last candidate, with a reason of its own."""

    def route(
        self, candidates: Sequence[ModelSpec], prompt: Prompt, assemble: Assemble, *, offered: int
    ) -> Route:
        return Route(candidates[-1], assemble(candidates[-1]), "always_last")


class Stranger:
    """A router that answers with a model it was not offered."""

    def route(
        self, candidates: Sequence[ModelSpec], prompt: Prompt, assemble: Assemble, *, offered: int
    ) -> Route:
        entry = ModelEntry(alias="elsewhere", upstreams=(), model="x", tokenizer=TokenizerSpec("t"))
        return Route(ModelSpec(entry=entry, context_window=10), prompt, "stranger")


@pytest.mark.parametrize("surface", SURFACES)
def test_a_router_set_by_dotted_path_decides_and_says_why(
    tier: Tier, http: httpx.Client, surface: str
) -> None:
    both(tier)
    with override_settings(ROUTER=f"{__name__}.LastCandidate"):
        assert ask(http, surface, SHORT, model="auto") == "large"
        assert ask(http, surface, SHORT, model="small") == "small"  # a fixed alias: no choice
    assert ask(http, surface, SHORT + " Once more.", model="auto") == "small"
    assert reasons() == [
        ("large", "always_last"),
        ("small", "requested"),
        ("small", "prompt_short"),
    ]


def spec(alias: str) -> ModelSpec:
    entry = ModelEntry(alias=alias, upstreams=("http://x/v1",), model=alias, tokenizer=FAKE)
    return ModelSpec(entry=entry, context_window=4096)


FAKE = TokenizerSpec("inference.tokenizers.FakeTokenizer")
PROMPT = Prompt(messages=[], prompt_tokens=70, passages=[], history_messages=0)


def never(spec: ModelSpec) -> Prompt:
    raise AssertionError("not assembled")


def test_a_router_that_cannot_be_loaded_or_picks_a_stranger_is_a_configuration_error() -> None:
    candidates = [spec("small"), spec("large")]
    with override_settings(ROUTER="tests.nowhere.Router"):
        with pytest.raises(ImproperlyConfigured, match="cannot import"):
            auto_route(candidates, PROMPT, never, offered=0)
        from apps.chat.checks import router_check

        assert [error.id for error in router_check()] == ["chat.E002"]
    stranger = override_settings(ROUTER=f"{__name__}.Stranger")
    with stranger, pytest.raises(ImproperlyConfigured, match="not a candidate"):
        auto_route(candidates, PROMPT, never, offered=0)


@pytest.mark.parametrize("reason", ["", "Prompt Long", "x" * 65, "long-prompt"])
def test_a_reason_is_a_short_lowercase_code(reason: str) -> None:
    with pytest.raises(ValueError, match="short code"):
        Route(spec("small"), PROMPT, reason)


def target(alias: str) -> Target:
    request = ChatRequest(model=alias, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    return Target(alias=alias, upstream=f"http://{alias}/v1", request=request)


@pytest.mark.parametrize(
    ("served", "tried", "expected"),
    [
        ("small", ["small"], "prompt_short"),
        ("large", ["small", "large"], "fallback"),
        ("large", ["large"], "breaker"),
    ],
)
def test_the_tier_outranks_the_plan(served: str, tried: list[str], expected: str) -> None:
    made = route_reason_served(
        RouteReason.PROMPT_SHORT,
        routed="small",
        served=served,
        tried=[target(alias) for alias in tried],
    )
    assert made == expected


def test_the_admin_lists_and_filters_by_the_reason(admin_client: Client, team: Team) -> None:
    make: Callable[..., UsageRecord] = UsageRecord.objects.create
    make(team=team, kind="chat", model="large", operation="answer", route_reason="breaker")
    make(team=team, kind="chat", model="small", operation="answer", route_reason="prompt_short")
    page = admin_client.get("/admin/usage/usagerecord/", {"route_reason__exact": "breaker"})
    assert page.status_code == 200
    html = page.content.decode()
    assert "breaker" in html and "prompt_short" in html  # the filter offers both
    assert page.context["cl"].result_count == 1


def test_through_the_real_llama_cpp_tier_auto_records_its_reasons(
    llama_server: str, http: httpx.Client, settings: Any
) -> None:
    """SmolLM2 on llama.cpp serves both aliases, counted with its GGUF tokenizer: the same
    prompt is short under one threshold and long under the next."""
    entry = {
        "upstreams": [llama_server],
        "model": "SmolLM2-135M-Instruct",
        "tokenizer": "gguf",
        "context_window": 2048,
        "max_output_tokens": 8,
    }
    settings.INFERENCE_MODELS = {"small": entry, "large": entry}
    settings.ROUTER_SMALL_MAX_PROMPT_TOKENS = 1500
    assert ask(http, "native", "Say hello.", model="auto", max_tokens=8) == "small"
    settings.ROUTER_SMALL_MAX_PROMPT_TOKENS = 10
    assert ask(http, "openai", "Say hello.", model="auto", max_tokens=8) == "large"
    assert reasons() == [("small", "prompt_short"), ("large", "prompt_long")]
    rows = UsageRecord.objects.filter(kind="chat")
    assert all(row.status == "ok" and row.completion_tokens > 0 for row in rows)
