"""Tools at the inference layer: what goes on the wire, what each server refuses, how
tool-call deltas are read, and how tool definitions and tool turns are counted.

The streams below are wire fixtures reconstructed from the servers' own docs and tests,
not captured here: the real tier (SmolLM2-135M's GGUF template renders no tools, and
llama-cpp-python's server answers tool calls only for its ``chatml-function-calling``
format or a named ``tool_choice``) cannot produce them.

- vLLM (``docs/features/tool_calling.md``; ``tests/tool_use/test_chat_completions.py``):
  a first delta with the call's ``index``, ``id``, ``type`` and ``function.name``, then
  ``function.arguments`` in pieces, then ``finish_reason: "tool_calls"``.
- Ollama's /v1 (``openai/openai.go``, ``toToolCalls``): each call whole in one delta with
  its ``index``, then a finish of ``tool_calls``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
import pytest

from inference import (
    ChatMessage,
    ChatRequest,
    FakeTokenizer,
    Finished,
    OpenAIClient,
    TextDelta,
    ToolCallDelta,
    Tools,
    assemble_prompt,
    tools_refused,
)
from inference.errors import ContextLengthExceeded

WEATHER = {
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


def _sse(*chunks: dict[str, Any]) -> bytes:
    lines = [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks]
    return b"".join(lines) + b"data: [DONE]\n\n"


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "x", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


VLLM_TOOL_STREAM = _sse(
    _choice({"role": "assistant", "content": ""}),
    _choice(
        {
            "tool_calls": [
                {
                    "id": "chatcmpl-tool-0a1b",
                    "type": "function",
                    "index": 0,
                    "function": {"name": "get_weather"},
                }
            ]
        }
    ),
    _choice({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    _choice({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    _choice({}, "tool_calls"),
)
OLLAMA_TOOL_STREAM = _sse(
    _choice(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_9x",
                    "index": 0,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        }
    ),
    _choice({"role": "assistant", "content": ""}, "tool_calls"),
)


async def _stream(body: bytes, request: ChatRequest) -> tuple[list[Any], dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    def handler(http_request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(http_request.content))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    client = OpenAIClient(base_url="http://tier/v1", transport=httpx.MockTransport(handler))
    events = [event async for event in client.stream_chat(request)]
    await client.aclose()
    return events, sent[0]


def _request(tools: Tools | None = None) -> ChatRequest:
    messages: list[ChatMessage] = [{"role": "user", "content": "Weather in Paris?"}]
    return ChatRequest(model="m", messages=messages, max_tokens=16, tools=tools, server="vllm")


async def test_tools_go_on_the_wire_as_openai_writes_them() -> None:
    tools = Tools(definitions=(WEATHER,), choice="required", parallel=False)
    _, sent = await _stream(VLLM_TOOL_STREAM, _request(tools))
    assert sent["tools"] == [WEATHER]
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("required", False)
    _, bare = await _stream(VLLM_TOOL_STREAM, _request())
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(bare)


@pytest.mark.parametrize("body", [VLLM_TOOL_STREAM, OLLAMA_TOOL_STREAM], ids=["vllm", "ollama"])
async def test_tool_call_deltas_are_read_as_typed_fragments(body: bytes) -> None:
    events, _ = await _stream(body, _request(Tools(definitions=(WEATHER,))))
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert {c.index for c in calls} == {0}
    assert [c.id for c in calls if c.id] == [calls[0].id] and calls[0].id
    assert [c.name for c in calls if c.name] == ["get_weather"]
    assert json.loads("".join(c.arguments for c in calls)) == {"city": "Paris"}
    assert not [e for e in events if isinstance(e, TextDelta)]
    assert [e for e in events if isinstance(e, Finished)] == [Finished("tool_calls")]


def test_which_server_refuses_which_tool_field() -> None:
    everything = Tools(definitions=(WEATHER,), choice="required", parallel=True)
    for server in ("vllm", "llama.cpp", "other"):
        assert tools_refused(server, everything) is None
    assert tools_refused("triton", Tools(definitions=(WEATHER,))) == "tools"
    assert tools_refused("ollama", everything) == "tool_choice"
    assert tools_refused("ollama", Tools(definitions=(WEATHER,), choice="auto")) is None
    assert tools_refused("tgi", everything) == "parallel_tool_calls"
    assert tools_refused("tgi", None) is None


def test_tool_definitions_and_tool_turns_count_toward_the_prompt() -> None:
    tokenizer = FakeTokenizer()
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    tail: list[ChatMessage] = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "18 C and sunny", "tool_call_id": "call_1"},
    ]
    common: dict[str, Any] = {
        "tokenizer": tokenizer,
        "question": "Weather in Paris?",
        "system": "Be brief.",
        "context_window": 4096,
        "max_output_tokens": 64,
    }
    bare = assemble_prompt(**common)
    with_tools = assemble_prompt(**common, tools=[WEATHER])
    with_tail = assemble_prompt(**common, tools=[WEATHER], tail=tail)
    assert with_tools.prompt_tokens == bare.prompt_tokens + tokenizer.count(json.dumps([WEATHER]))
    assert with_tools.tools == (WEATHER,)
    assert with_tail.prompt_tokens == tokenizer.count_chat(with_tail.messages, tools=[WEATHER])
    assert with_tail.messages[-2:] == tail  # after the question, whole, as sent
    assert with_tail.messages[-3]["role"] == "user"


def test_passages_stay_with_the_question_before_the_tool_turns() -> None:
    from inference import Passage

    tail: list[ChatMessage] = [
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "result", "tool_call_id": "c"},
    ]
    prompt = assemble_prompt(
        tokenizer=FakeTokenizer(),
        question="Q?",
        passages=[Passage("Doc", "fact")],
        context_window=4096,
        max_output_tokens=64,
        tail=tail,
    )
    assert "<passages>" in prompt.messages[-3]["content"]
    assert prompt.messages[-1] == tail[-1]


def test_tools_that_do_not_fit_are_context_length_exceeded() -> None:
    huge = {**WEATHER, "function": {**WEATHER["function"], "description": "word " * 3000}}
    with pytest.raises(ContextLengthExceeded):
        assemble_prompt(
            tokenizer=FakeTokenizer(),
            question="Q?",
            context_window=2048,
            max_output_tokens=64,
            tools=[huge],
        )


def test_smollm2s_template_renders_no_tools_so_they_cost_it_nothing() -> None:
    """The real tokenizer passes tools to the GGUF's template as llama-cpp-python's server
    does; SmolLM2's template reads neither ``tools`` nor ``tool_calls``, so they add no
    token, as on the tier."""
    from inference import GGUFTokenizer

    tokenizer = GGUFTokenizer()
    ask: list[ChatMessage] = [{"role": "user", "content": "Weather in Paris?"}]
    assert tokenizer.count_chat(ask, tools=[WEATHER]) == tokenizer.count_chat(ask)
    assert "get_weather" not in tokenizer.render(ask, tools=[WEATHER])
