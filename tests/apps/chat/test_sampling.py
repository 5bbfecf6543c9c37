"""OpenAI's sampling fields on both answer surfaces: checked with OpenAI's bounds (a 400
naming the field), carried to the tier in its server's dialect, refused before admission
where the server cannot honour one, and kept apart in the response cache."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from apps.chat.apis import ConversationMessageCreateApi
from apps.chat.openai_apis import ChatCompletionsApi
from apps.core.exceptions import as_application_error
from apps.usage.models import UsageRecord
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.apps.chat.test_request import CALLER, MODEL, validated
from tests.fake_upstream import FakeUpstream

CHAT = {"model": "small", "messages": [{"role": "user", "content": "Say hello"}]}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
ALL_FIELDS: dict[str, Any] = {
    "temperature": 0,
    "top_p": 0.9,
    "stop": ["\n\n", "END"],
    "seed": 42,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "logit_bias": {"50256": -100},
    "response_format": JSON_SCHEMA,
    "user": "end-user-7",
    "metadata": {"run": "a"},
    "n": 1,
    "logprobs": True,
    "top_logprobs": 2,
}
SURFACES = [
    (ChatCompletionsApi.InputSerializer, CHAT),
    (ConversationMessageCreateApi.InputSerializer, {"content": "Say hello"}),
]

VALID: list[tuple[str, Any, Any]] = [
    ("temperature", 2, 2.0),
    ("top_p", 0, 0.0),
    ("stop", "END", ("END",)),
    ("stop", ["a", "b", "c", "d"], ("a", "b", "c", "d")),
    ("seed", -(2**63), -(2**63)),
    ("presence_penalty", -2, -2.0),
    ("frequency_penalty", 2, 2.0),
    ("logit_bias", {"1": 100, "2": -100}, (("1", 100.0), ("2", -100.0))),
    ("response_format", {"type": "json_object"}, {"type": "json_object"}),
    ("user", "x" * 256, "x" * 256),
    ("temperature", None, None),
    ("logprobs", True, True),
    ("logprobs", False, None),  # false is the default: left out
]
INVALID: list[tuple[str, Any, str]] = [
    ("temperature", 2.5, "invalid_value"),
    ("temperature", "hot", "invalid_value"),
    ("top_p", 1.5, "invalid_value"),
    ("stop", ["a", "b", "c", "d", "e"], "invalid_value"),
    ("stop", [1], "invalid_value"),
    ("seed", 2**63, "invalid_value"),
    ("seed", 1.5, "invalid_value"),
    ("presence_penalty", -2.1, "invalid_value"),
    ("frequency_penalty", 3, "invalid_value"),
    ("logit_bias", {"abc": 1}, "invalid_value"),
    ("logit_bias", {"1": 101}, "invalid_value"),
    ("logit_bias", {str(i): 1 for i in range(301)}, "invalid_value"),
    ("response_format", {"type": "xml"}, "invalid_value"),
    ("response_format", {"type": "json_schema"}, "invalid_value"),
    ("user", "x" * 257, "invalid_value"),
    ("metadata", {str(i): "v" for i in range(17)}, "invalid_value"),
    ("metadata", {"k" * 65: "v"}, "invalid_value"),
    ("metadata", {"k": "v" * 513}, "invalid_value"),
    ("n", 2, "unsupported_parameter"),
    ("n", 0, "invalid_value"),
    ("logprobs", "yes please", "invalid_value"),
    ("top_logprobs", 21, "invalid_value"),
    ("top_logprobs", 2, "invalid_value"),  # without logprobs: true
]


@pytest.mark.parametrize(("serializer", "base"), SURFACES)
@pytest.mark.parametrize(("name", "value", "expected"), VALID)
def test_each_field_in_bounds_reaches_the_request(
    serializer: Any, base: dict[str, Any], name: str, value: Any, expected: Any
) -> None:
    data = validated(serializer, {**base, name: value})
    kwargs = {"conversation": 1} if "content" in base else {}
    request = serializer.to_request(data, caller=CALLER, model=MODEL, **kwargs)
    assert getattr(request, name) == expected


@pytest.mark.parametrize(("serializer", "base"), SURFACES)
@pytest.mark.parametrize(("name", "value", "code"), INVALID)
def test_each_field_out_of_bounds_is_a_400_naming_it(
    serializer: Any, base: dict[str, Any], name: str, value: Any, code: str
) -> None:
    with pytest.raises(Exception) as raised:  # DRF's or ours, mapped below
        validated(serializer, {**base, name: value})
    error = as_application_error(raised.value)
    assert error is not None and error.status == 400
    assert (error.code, (error.param or "").split(".")[0]) == (code, name)


def test_max_completion_tokens_and_max_tokens_must_agree() -> None:
    with pytest.raises(Exception) as raised:
        validated(
            ChatCompletionsApi.InputSerializer,
            {**CHAT, "max_tokens": 5, "max_completion_tokens": 6},
        )
    error = as_application_error(raised.value)
    assert error is not None and error.param == "max_completion_tokens"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("web_search_options", {}),
        ("functions", [{"name": "f", "parameters": {}}]),
        ("function_call", "auto"),
        ("reasoning_effort", "high"),
        ("verbosity", "low"),
        ("service_tier", "flex"),
    ],
)
def test_openai_fields_no_tier_serves_are_refused_by_name(name: str, value: Any) -> None:
    with pytest.raises(Exception) as raised:
        validated(ChatCompletionsApi.InputSerializer, {**CHAT, name: value})
    error = as_application_error(raised.value)
    assert error is not None and (error.code, error.param) == ("unsupported_parameter", name)


def test_fields_that_change_no_output_are_accepted() -> None:
    body = {
        **CHAT,
        "modalities": ["text"],
        "service_tier": "auto",
        "prompt_cache_key": "k",
        "safety_identifier": "u",
        "reasoning_effort": None,
    }
    assert validated(ChatCompletionsApi.InputSerializer, body)["model"] == "small"


def test_unknown_fields_are_ignored() -> None:
    data = validated(ChatCompletionsApi.InputSerializer, {**CHAT, "frobnicate": 1})
    assert "frobnicate" not in data


# Through the app and the fake tier on a real socket.


TIER_GETS = {
    "temperature": 0.0,
    "top_p": 0.9,
    "stop": ["\n\n", "END"],
    "seed": 42,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "logit_bias": {"50256": -100.0},
    "logprobs": True,
    "top_logprobs": 2,
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["vllm", "llama.cpp"])
def test_the_openai_sdk_sends_every_field_and_the_tier_gets_them(
    upstream: FakeUpstream, sdk: openai.OpenAI, settings: Any, server: str
) -> None:
    settings.INFERENCE_SERVER = server
    completion = sdk.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": "Say hello"}],
        max_completion_tokens=20,
        **ALL_FIELDS,
    )
    choice = completion.choices[0]
    assert choice.message.content == "Hello world."
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert [entry.token for entry in choice.logprobs.content] == ["Hello", " world", "."]
    assert [len(entry.top_logprobs) for entry in choice.logprobs.content] == [2, 2, 2]
    sent = upstream.requests[0]
    assert {k: sent.get(k) for k in TIER_GETS} == TIER_GETS
    assert sent["max_tokens"] == 20 and sent["user"] == "end-user-7"
    assert "metadata" not in sent and "n" not in sent
    if server == "vllm":
        assert sent["response_format"] == JSON_SCHEMA
    else:
        assert sent["response_format"] == {"type": "json_object", "schema": SCHEMA}


@pytest.mark.django_db(transaction=True)
def test_the_native_api_carries_the_same_fields_in_ollamas_dialect(
    upstream: FakeUpstream, http: httpx.Client, settings: Any
) -> None:
    settings.INFERENCE_SERVER = "ollama"
    body = {"temperature": 0.3, "seed": 5, "stop": "END", "user": "u", "top_p": 0.8}
    frames = ask_stream(http, conversation_for(http), content="Say hello", **body)
    assert frames[-1]["event"] == "done"
    sent = upstream.requests[0]
    assert {k: sent.get(k) for k in ("temperature", "seed", "stop", "top_p")} == {
        "temperature": 0.3,
        "seed": 5,
        "stop": ["END"],
        "top_p": 0.8,
    }
    assert "user" not in sent  # Ollama's /v1 has no use for it: it changes no output


@pytest.mark.django_db(transaction=True)
def test_a_field_the_server_cannot_honour_is_refused_before_anything_is_reserved(
    upstream: FakeUpstream, sdk: openai.OpenAI, settings: Any
) -> None:
    settings.INFERENCE_SERVER = "ollama"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="small",
            messages=[{"role": "user", "content": "Say hello"}],
            logit_bias={"1": 5},
        )
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("unsupported_parameter", "logit_bias")
    assert upstream.requests == [] and not UsageRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("server", "fields"),
    [("vllm", {"n": 2}), ("triton", {"logprobs": True}), ("triton", {"logit_bias": {"1": 1}})],
)
def test_what_no_tier_or_the_server_cannot_honour_is_refused_by_name(
    upstream: FakeUpstream, sdk: openai.OpenAI, settings: Any, server: str, fields: dict[str, Any]
) -> None:
    settings.INFERENCE_SERVER = server
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="small", messages=[{"role": "user", "content": "Say hello"}], **fields
        )
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["param"] == next(iter(fields))
    assert refused.value.body["code"] == "unsupported_parameter"
    assert upstream.requests == []


@pytest.mark.django_db(transaction=True)
def test_logprobs_stream_in_each_chunk_and_in_the_native_events(
    upstream: FakeUpstream, sdk: openai.OpenAI, http: httpx.Client
) -> None:
    stream = sdk.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": "Say hello"}],
        logprobs=True,
        top_logprobs=3,
        stream=True,
    )
    tokens = [
        entry
        for chunk in stream
        for choice in chunk.choices
        if choice.logprobs is not None
        for entry in choice.logprobs.content or []
    ]
    assert [entry.token for entry in tokens] == ["Hello", " world", "."]
    assert tokens[0].top_logprobs[0].token == "Hello" and len(tokens[0].top_logprobs) == 3
    assert tokens[0].bytes == list(b"Hello") and tokens[0].logprob == -0.25
    frames = ask_stream(http, conversation_for(http), content="Say hello", logprobs=True)
    deltas = [frame["data"] for frame in frames if frame["event"] == "delta"]
    entries = [entry for d in deltas for entry in d["logprobs"]]  # a read's tokens: one delta
    assert [entry["token"] for entry in entries] == ["Hello", " world", "."]
    assert "".join(d["text"] for d in deltas) == "Hello world."
    assert all(entry["top_logprobs"] == [] for entry in entries)


@pytest.mark.django_db(transaction=True)
def test_logprobs_are_in_the_native_body_and_never_answered_from_the_cache(
    upstream: FakeUpstream, http: httpx.Client, settings: Any
) -> None:
    settings.RESPONSE_CACHE_TTL = 3600
    settings.RESPONSE_CACHE_REDIS_URL = ""

    def ask(**body: Any) -> dict[str, Any]:
        url = f"/api/v1/conversations/{conversation_for(http)}/messages"
        response = http.post(url, json={"content": "Say hello", **body})
        assert response.status_code == 201, response.text
        return dict(response.json())

    for _ in range(2):
        answer = ask(logprobs=True)
        assert [entry["token"] for entry in answer["logprobs"]] == ["Hello", " world", "."]
        assert answer["usage"]["cache_hit"] is False
    assert "logprobs" not in ask() and ask()["usage"]["cache_hit"] is True
    assert len(upstream.requests) == 3


# The response cache.


@pytest.fixture
def _cache_on(settings: Any) -> None:
    settings.RESPONSE_CACHE_TTL = 3600
    settings.RESPONSE_CACHE_REDIS_URL = ""


def _hit(http: httpx.Client, **body: Any) -> bool:
    frames = ask_stream(http, conversation_for(http), content="Where is the key?", **body)
    return bool(next(f["data"] for f in frames if f["event"] == "usage")["cache_hit"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_cache_on")
def test_another_temperature_never_replays_the_others_answer(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    assert not _hit(http, temperature=0)
    assert _hit(http, temperature=0)
    assert not _hit(http, temperature=0.5, seed=1)  # another key
    assert _hit(http, temperature=0.5, seed=1)  # pinned by its seed: deterministic
    assert not _hit(http, temperature=0.5, seed=2)
    assert len(upstream.requests) == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_cache_on")
def test_sampled_output_without_a_seed_is_never_replayed(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    assert not _hit(http, temperature=0.9)
    assert not _hit(http, temperature=0.9)
    assert len(upstream.requests) == 2
