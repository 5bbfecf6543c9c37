"""Every inference server of the seeds, at the wire: what vLLM, Ollama, TGI and Triton's
OpenAI frontend send (``tests/fixtures/wire/<server>/``, each README says whether real or
reconstructed from the server's source) read by the one client into the same events,
usage and errors. (llama.cpp's real captures: tests/inference/test_client.py.)"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from inference import (
    ChatRequest,
    Finished,
    OpenAIClient,
    ReasoningDelta,
    Retry,
    TextDelta,
    UpstreamUsage,
)
from inference.dialects import (
    OLLAMA_DEFAULT_NUM_CTX,
    ollama_context_window,
    upstream_error,
    usage_from,
)
from inference.errors import (
    ContextLengthExceeded,
    InferenceError,
    InferenceUnavailable,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamRejected,
)

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
REQUEST = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=16)


def replaying(name: str, *, status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    body = (WIRE / name).read_bytes()
    kind = "text/event-stream" if name.endswith(".sse") else "application/json"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": kind})

    return handler


def client_of(handler: Callable[[httpx.Request], httpx.Response]) -> OpenAIClient:
    return OpenAIClient(
        base_url="http://tier/v1",
        transport=httpx.MockTransport(handler),
        retry=Retry(attempts=3, base_delay=0.0, max_delay=0.0),
    )


async def events_of(name: str) -> list[object]:
    client = client_of(replaying(name))
    return [event async for event in client.stream_chat(REQUEST)]


def text(events: list[object]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def reasoning(events: list[object]) -> str:
    return "".join(e.text for e in events if isinstance(e, ReasoningDelta))


def usage(events: list[object]) -> list[UpstreamUsage]:
    return [e for e in events if isinstance(e, UpstreamUsage)]


async def failure_after_text(name: str) -> tuple[str, InferenceError]:
    """The text that arrived before the stream failed, and the error it failed with; the
    request is never retried once text went out (one request reached the tier)."""
    calls: list[int] = []
    replay = replaying(name)

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return replay(request)

    seen: list[object] = []
    with pytest.raises(InferenceError) as raised:
        async for event in client_of(handler).stream_chat(REQUEST):
            seen.append(event)
    assert len(calls) == 1
    return text(seen), raised.value


# --------------------------------------------------------------------------- vLLM


async def test_vllm_reasoning_content_deltas_of_older_releases() -> None:
    events = await events_of("vllm-0.30/chat_stream_reasoning_content.sse")
    assert reasoning(events) == "Compare 9.11 and 9.8: 0.11 < 0.80."
    assert text(events) == "9.8 is larger."
    assert usage(events) == [UpstreamUsage(prompt_tokens=14, completion_tokens=13)]
    assert Finished("stop") in events


async def test_vllm_error_line_mid_stream_ends_the_answer_as_unavailable() -> None:
    before, error = await failure_after_text("vllm-0.30/chat_stream_error.sse")
    assert before == "The answer"
    assert isinstance(error, InferenceUnavailable) and error.status == 502
    assert "EngineCore" not in str(error)


def test_vllm_unknown_model_is_the_tier_failing_not_the_caller() -> None:
    body = (WIRE / "vllm-0.30/error_model_not_found.json").read_text()
    error = upstream_error(404, body, {})
    assert type(error) is InferenceError and error.status == 502
    assert "qwen-large" not in str(error)


# --------------------------------------------------------------------------- Ollama


async def test_ollama_stream_with_its_usage_chunk() -> None:
    events = await events_of("ollama-0.33/chat_stream_usage.sse")
    assert text(events) == "The sky is blue."
    assert usage(events) == [UpstreamUsage(prompt_tokens=31, completion_tokens=5)]
    assert events.index(Finished("stop")) < events.index(usage(events)[0])


async def test_ollama_before_0_5_2_sends_no_usage_so_it_is_counted() -> None:
    events = await events_of("ollama-0.5.1/chat_stream.sse")
    assert text(events) == "The sky is blue."
    assert usage(events) == []  # the app counts it (apps/chat/services/settle.py usage_of)
    assert events[-1] == Finished("stop")


async def test_ollama_thinking_arrives_in_delta_reasoning() -> None:
    events = await events_of("ollama-0.33/chat_stream_reasoning.sse")
    assert reasoning(events) == "The user asks for 2+2."
    assert text(events) == "2 + 2 = 4."


def test_ollama_model_not_pulled_is_the_tier_failing() -> None:
    body = (WIRE / "ollama-0.33/error_model_not_found.json").read_text()
    error = upstream_error(404, body, {})
    assert type(error) is InferenceError and error.status == 502
    assert "pulling" not in str(error)


def test_ollama_window_is_num_ctx_and_a_truncating_num_ctx_is_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import json

    show = json.loads((WIRE / "ollama-0.33/show_num_ctx.json").read_text())
    with caplog.at_level(logging.WARNING, logger="inference.dialects"):
        assert ollama_context_window(show, model="llama3.2:3b") == 8192
    assert "num_ctx 8192" in caplog.text and "131072" in caplog.text
    assert "silently truncates" in caplog.text

    caplog.clear()
    default = json.loads((WIRE / "ollama-0.33/show_default.json").read_text())
    with caplog.at_level(logging.WARNING, logger="inference.dialects"):
        assert ollama_context_window(default) == OLLAMA_DEFAULT_NUM_CTX
    assert "the server's default" in caplog.text

    caplog.clear()
    small = {**show, "model_info": {"general.architecture": "llama", "llama.context_length": 2048}}
    with caplog.at_level(logging.WARNING, logger="inference.dialects"):
        assert ollama_context_window(small) == 2048  # never more than the model knows
    assert caplog.text == ""


async def test_the_client_reads_the_window_from_ollamas_api_show() -> None:
    show = (WIRE / "ollama-0.33/show_num_ctx.json").read_bytes()
    asked: list[tuple[str, str, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append((request.method, request.url.path, request.content))
        if request.url.path == "/v1/models":  # Ollama lists no context length
            return httpx.Response(200, json={"object": "list", "data": [{"id": "llama3.2:3b"}]})
        if request.url.path == "/api/show":
            return httpx.Response(200, content=show)
        return httpx.Response(404)

    assert await client_of(handler).context_window("llama3.2:3b") == 8192
    assert asked[-1] == ("POST", "/api/show", b'{"model":"llama3.2:3b"}')


async def test_the_window_is_vllms_max_model_len_and_none_when_the_tier_is_silent() -> None:
    models = (WIRE / "vllm-0.30/models.json").read_bytes()

    def vllm(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200 if request.url.path == "/v1/models" else 404, content=models)

    assert await client_of(vllm).context_window("Qwen/Qwen2.5-7B-Instruct") == 32768
    llama_cpp = (WIRE / "llama-cpp-python-0.3.36/models.json").read_bytes()

    def silent(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200 if request.url.path == "/v1/models" else 404, content=llama_cpp)

    assert await client_of(silent).context_window("SmolLM2-135M-Instruct") is None


# --------------------------------------------------------------------------- TGI


async def test_tgi_stream_and_its_usage_chunk() -> None:
    events = await events_of("tgi-3.3/chat_stream_usage.sse")
    assert text(events) == "Paris is the capital of France."
    assert usage(events) == [UpstreamUsage(prompt_tokens=42, completion_tokens=8)]
    assert Finished("stop") in events


async def test_tgi_before_3_2_puts_usage_on_the_final_chunk() -> None:
    events = await events_of("tgi-3.3/chat_stream_usage_on_final_chunk.sse")
    assert text(events) == "Paris is the capital of"
    assert usage(events) == [UpstreamUsage(prompt_tokens=42, completion_tokens=5)]
    assert Finished("length") in events


def test_tgi_non_streaming_usage_reads_the_same() -> None:
    import json

    body = json.loads((WIRE / "tgi-3.3/chat_nonstream.json").read_text())
    assert usage_from(body["usage"]) == UpstreamUsage(prompt_tokens=42, completion_tokens=8)


async def test_tgi_finish_reasons_read_as_openais() -> None:
    chunk = (
        'data: {"object":"chat.completion.chunk","id":"","choices":[{"index":0,"delta":'
        '{"role":"assistant","content":"."},"logprobs":null,"finish_reason":"%s"}]}\n\n'
    )
    for reason in ("eos_token", "stop_sequence"):
        body = (chunk % reason + "data: [DONE]\n\n").encode()
        client = client_of(lambda request, body=body: httpx.Response(200, content=body))
        assert [e async for e in client.stream_chat(REQUEST)][-1] == Finished("stop")


async def test_tgi_error_mid_stream_ends_the_answer() -> None:
    before, error = await failure_after_text("tgi-3.3/chat_stream_error.sse")
    assert before == "Paris is"
    assert error.status == 502 and "CUDA" not in str(error)


@pytest.mark.parametrize(
    ("name", "status", "error", "api_status"),
    [
        ("tgi-3.3/error_context_length.json", 422, ContextLengthExceeded, 400),
        ("tgi-3.3/error_input_too_long.json", 422, ContextLengthExceeded, 400),
        ("tgi-3.3/error_validation.json", 422, UpstreamRejected, 400),
        ("tgi-3.3/error_overloaded.json", 429, UpstreamRateLimited, 429),
    ],
)
async def test_tgi_errors_before_the_stream(
    name: str, status: int, error: type[InferenceError], api_status: int
) -> None:
    with pytest.raises(error) as raised:
        async for _ in client_of(replaying(name, status=status)).stream_chat(REQUEST):
            pass
    assert raised.value.status == api_status
    assert "Input validation" not in str(raised.value)


# --------------------------------------------------------------------------- Triton


async def test_triton_stream_and_its_usage_chunk() -> None:
    events = await events_of("triton-openai-25.08/chat_stream_usage.sse")
    assert text(events) == "Hello! How can I help?"
    assert usage(events) == [UpstreamUsage(prompt_tokens=39, completion_tokens=8)]
    assert Finished("stop") in events


async def test_triton_without_token_counts_sends_no_usage_so_it_is_counted() -> None:
    events = await events_of("triton-openai-25.08/chat_stream.sse")
    assert text(events) == "Hello! How can I help?" and usage(events) == []


async def test_triton_cut_stream_is_a_protocol_error() -> None:
    before, error = await failure_after_text("triton-openai-25.08/chat_stream_cut.sse")
    assert before == "Hello!"
    assert isinstance(error, UpstreamProtocolError) and error.status == 502


def test_triton_fastapi_errors() -> None:
    unknown = (WIRE / "triton-openai-25.08/error_unknown_model.json").read_text()
    error = upstream_error(400, unknown, {})  # its 400 is the deployment's fault: 502
    assert type(error) is InferenceError and error.status == 502
    assert "llama-3.1-70b" not in str(error)
    failed = (WIRE / "triton-openai-25.08/error_server.json").read_text()
    assert type(upstream_error(500, failed, {})) is InferenceUnavailable
    bad = '{"detail": "`stream_options` can only be used when `stream` is True"}'
    assert type(upstream_error(400, bad, {})) is UpstreamRejected
