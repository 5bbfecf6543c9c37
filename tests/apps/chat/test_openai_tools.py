"""Tools on ``/v1/chat/completions``, end to end with the fake tier and the ``openai`` SDK:
``tools``, ``tool_choice``, ``parallel_tool_calls``, assistant ``tool_calls`` and ``tool``
messages reach the tier; calls come back in OpenAI's shape, streamed as argument deltas
and whole, with ``finish_reason: "tool_calls"``; definitions count toward the prompt.

The fake tier streams calls as vLLM does (see ``tests/inference/test_tools.py`` for the
wire fixtures, reconstructed from vLLM's and Ollama's docs and tests). The real tier
cannot be used here: SmolLM2-135M's GGUF chat template renders no tools and
llama-cpp-python's server makes calls only with its ``chatml-function-calling`` format
or a named ``tool_choice``, so no packaged model and template produce OpenAI tool calls.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from apps.accounts.services import IssuedKey
from apps.usage.models import UsageRecord
from inference import FakeTokenizer
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL = {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_RAG = {"rag": {"enabled": False}}


def _loop_messages() -> list[dict[str, Any]]:
    """A tool loop's second request: the question, the call, its result."""
    call = {
        "id": CALL["id"],
        "type": "function",
        "function": {"name": CALL["name"], "arguments": CALL["arguments"]},
    }
    return [
        {"role": "system", "content": "Use tools."},
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": CALL["id"], "content": "18 C and sunny"},
    ]


def test_tools_and_tool_turns_reach_the_tier(upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    sdk.chat.completions.create(
        model="small",
        messages=_loop_messages(),  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        extra_body=NO_RAG,
    )
    sent = upstream.requests[0]
    assert sent["tools"] == [WEATHER]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["parallel_tool_calls"] is False
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]  # the result read last
    assistant, tool = sent["messages"][2:]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": CALL["arguments"],
    }
    assert (tool["tool_call_id"], tool["content"]) == ("call_1", "18 C and sunny")


def test_a_call_comes_back_whole_with_finish_reason_tool_calls(
    upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    upstream.script.tokens, upstream.script.tool_calls = [], [CALL]
    completion = sdk.chat.completions.create(
        model="small",
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        extra_body=NO_RAG,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert (calls[0].id, calls[0].type) == ("call_1", "function")
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    usage = completion.usage
    assert usage is not None and usage.completion_tokens > 0  # the call's tokens, counted
    assert UsageRecord.objects.get(kind="chat").completion_tokens == usage.completion_tokens


def test_a_call_streams_as_argument_deltas(upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    upstream.script.tokens, upstream.script.tool_calls = [], [CALL]
    upstream.script.delay = 0.01  # one fragment a read, as a tier streams them
    stream = sdk.chat.completions.create(
        model="small",
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_RAG,
    )
    chunks = list(stream)
    fragments = [
        call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])
    ]
    assert len(fragments) > 2  # the arguments came in pieces
    first = fragments[0]
    assert (first.index, first.id, first.type) == (0, "call_1", "function")
    assert first.function is not None and first.function.name == "get_weather"
    assert all(f.id is None and f.index == 0 for f in fragments[1:])
    arguments = "".join((f.function.arguments or "") for f in fragments if f.function)
    assert json.loads(arguments) == {"city": "Paris"}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_the_tools_loop_with_the_sdk(upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    """Call, run the tool, send its result, get the answer: as an agent framework does."""
    upstream.script.tokens, upstream.script.tool_calls = [], [CALL]
    messages: list[Any] = [*ASK]
    first = sdk.chat.completions.create(
        model="small", messages=messages, tools=[WEATHER], extra_body=NO_RAG
    )  # type: ignore[list-item]
    asked = first.choices[0].message
    assert asked.tool_calls and first.choices[0].finish_reason == "tool_calls"
    messages.append(asked.model_dump(exclude_none=True, exclude={"reasoning_content"}))
    for call in asked.tool_calls:
        city = json.loads(call.function.arguments)["city"]  # type: ignore[union-attr]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{city}: 18 C"})
    upstream.script.tokens, upstream.script.tool_calls = ["It is 18 C."], []
    final = sdk.chat.completions.create(
        model="small", messages=messages, tools=[WEATHER], extra_body=NO_RAG
    )  # type: ignore[list-item]
    assert final.choices[0].message.content == "It is 18 C."
    assert final.choices[0].finish_reason == "stop"
    second = upstream.requests[1]["messages"]
    assert [m["role"] for m in second][-3:] == ["user", "assistant", "tool"]
    assert second[-1] == {"role": "tool", "content": "Paris: 18 C", "tool_call_id": "call_1"}
    assert UsageRecord.objects.filter(kind="chat").count() == 2


def test_tool_definitions_count_toward_the_prompt_and_the_hold(
    upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    """The fake tier sends no usage: the prompt is the app's own count, which takes the
    tool definitions through the (fake) template as the tier renders them."""
    plain = sdk.chat.completions.create(model="small", messages=ASK, extra_body=NO_RAG)  # type: ignore[arg-type]
    tooled = sdk.chat.completions.create(
        model="small", messages=ASK, tools=[WEATHER], extra_body=NO_RAG
    )  # type: ignore[list-item]
    assert plain.usage is not None and tooled.usage is not None
    tokenizer = FakeTokenizer()
    sent = upstream.requests[1]
    assert tooled.usage.prompt_tokens == tokenizer.count_chat(sent["messages"], tools=sent["tools"])
    extra = tooled.usage.prompt_tokens - plain.usage.prompt_tokens
    assert extra == tokenizer.count(json.dumps([WEATHER])) > 0
    records = UsageRecord.objects.filter(kind="chat").order_by("id")
    assert [r.prompt_tokens for r in records] == [
        plain.usage.prompt_tokens,
        tooled.usage.prompt_tokens,
    ]


def test_tools_too_big_for_the_window_are_refused_before_the_tier(
    upstream: FakeUpstream, sdk: openai.OpenAI, settings: Any
) -> None:
    huge = {**WEATHER, "function": {**WEATHER["function"], "description": "word " * 40000}}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="small", messages=ASK, tools=[huge], extra_body=NO_RAG)  # type: ignore[list-item]
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "context_length_exceeded"
    assert upstream.requests == []


def test_a_server_that_cannot_take_tools_is_a_400_naming_tools(
    upstream: FakeUpstream, sdk: openai.OpenAI, settings: Any
) -> None:
    settings.INFERENCE_SERVER = "triton"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="small", messages=ASK, tools=[WEATHER], extra_body=NO_RAG)  # type: ignore[list-item]
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("unsupported_parameter", "tools")
    assert upstream.requests == [] and not UsageRecord.objects.exists()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": ASK, "tool_choice": "auto"}, "tool_choice"),
        (
            {
                "messages": ASK,
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "other"}},
            },
            "tool_choice",
        ),
        ({"messages": [*ASK, {"role": "tool", "content": "x"}]}, "messages"),
        ({"messages": ASK, "tools": [WEATHER, WEATHER]}, "tools"),
        ({"messages": ASK, "tools": [WEATHER] * 129}, "tools"),
        ({"messages": [*ASK, {"role": "assistant", "content": None}, *ASK]}, "messages"),
        (
            {
                "messages": ASK,
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": [1]},
            },
            "tool_choice",
        ),
    ],
    ids=[
        "choice_without_tools",
        "choice_not_among_tools",
        "tool_without_call_id",
        "duplicate_names",
        "too_many_tools",
        "null_content_without_calls",
        "choice_function_not_an_object",
    ],
)
def test_malformed_tool_requests_are_400_before_the_tier(
    upstream: FakeUpstream, http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    response = http.post("/v1/chat/completions", json={"model": "small", **body, **NO_RAG})
    assert response.status_code == 400, response.text
    assert str(response.json()["error"]["param"]).startswith(param)
    assert upstream.requests == []


@pytest.mark.integration
def test_a_named_tool_choice_through_the_real_tier(
    llama_server: str, asgi_server: str, issued_key: IssuedKey, settings: Any
) -> None:
    """llama-cpp-python's server, given a ``tool_choice`` that names a function, constrains
    SmolLM2 to that function's arguments with a grammar and answers with the call: the one
    tool path the packaged model can take (its template renders no tool definitions)."""
    settings.INFERENCE_BASE_URL = llama_server
    settings.INFERENCE_SERVER = "llama.cpp"
    with openai.OpenAI(
        base_url=f"{asgi_server}/v1", api_key=issued_key.secret, max_retries=0, timeout=120
    ) as client:
        completion = client.chat.completions.create(
            model="small",
            messages=ASK,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=40,
            temperature=0,
            seed=1,
            extra_body=NO_RAG,
        )
    choice = completion.choices[0]
    calls = choice.message.tool_calls
    assert calls, choice
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert isinstance(json.loads(calls[0].function.arguments), dict)  # type: ignore[union-attr]
    assert choice.finish_reason == "tool_calls"


@pytest.mark.integration
def test_a_named_tool_choice_streams_through_the_real_tier(
    llama_server: str, asgi_server: str, issued_key: IssuedKey, settings: Any
) -> None:
    """The same, streamed: the call arrives as ``delta.tool_calls`` fragments."""
    settings.INFERENCE_BASE_URL = llama_server
    settings.INFERENCE_SERVER = "llama.cpp"
    with openai.OpenAI(
        base_url=f"{asgi_server}/v1", api_key=issued_key.secret, max_retries=0, timeout=120
    ) as client:
        stream = client.chat.completions.create(
            model="small",
            messages=ASK,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=40,
            temperature=0,
            seed=1,
            stream=True,
            extra_body=NO_RAG,
        )
        chunks = list(stream)
    fragments = [
        call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])
    ]
    assert fragments and fragments[0].function is not None
    assert fragments[0].function.name == "get_weather"
    # llama-cpp-python repeats the id and name on every fragment; OpenAI's clients join
    # what repeats, so only the first fragment carries them
    assert all(f.id is None and f.function and f.function.name is None for f in fragments[1:])
    arguments = "".join((f.function.arguments or "") for f in fragments if f.function)
    assert isinstance(json.loads(arguments), dict)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
