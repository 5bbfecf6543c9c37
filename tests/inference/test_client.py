"""The OpenAI-compatible client against recorded wire transcripts (llama.cpp, vLLM)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
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
    Timeouts,
    UpstreamUsage,
)
from inference.errors import (
    ContextLengthExceeded,
    InferenceError,
    InferenceTimeout,
    InferenceUnavailable,
    UpstreamProtocolError,
)
from tests.fake_upstream import Script, fake_upstream

# Copied from shared/wire: what llama.cpp's server really sends, and vLLM's shapes.
WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"

REQUEST = ChatRequest(model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=12)
NO_WAIT = Retry(attempts=3, base_delay=0.0, max_delay=0.0)


def wire(name: str) -> bytes:
    return (WIRE / name).read_bytes()


def client_for(
    handler: Callable[[httpx.Request], httpx.Response], **kwargs: object
) -> OpenAIClient:
    return OpenAIClient(
        base_url="http://tier/v1",
        transport=httpx.MockTransport(handler),
        retry=NO_WAIT,
        **kwargs,  # type: ignore[arg-type]
    )


def sse(body: bytes) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return handler


async def collect(client: OpenAIClient) -> list[object]:
    return [event async for event in client.stream_chat(REQUEST)]


async def test_llama_cpp_stream_has_text_and_no_usage() -> None:
    events = await collect(client_for(sse(wire("llama-cpp-python-0.3.36/chat_stream.sse"))))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "The most obvious example of a color is the color red."
    assert events[-1] == Finished("length")
    assert not any(isinstance(e, UpstreamUsage) for e in events)


async def test_vllm_usage_chunk_with_empty_choices() -> None:
    events = await collect(client_for(sse(wire("vllm-0.30/chat_stream_usage.sse"))))
    assert events[-1] == UpstreamUsage(prompt_tokens=35, completion_tokens=9)
    assert Finished("stop") in events


async def test_vllm_reasoning_deltas() -> None:
    events = await collect(client_for(sse(wire("vllm-0.30/chat_stream_reasoning.sse"))))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert reasoning.startswith("\nOkay, compare")
    assert "9.8" in answer and "Okay" not in answer


def chunks(
    *deltas: dict[str, object], usage: dict[str, object] | None = None, finish: str | None = "stop"
) -> bytes:
    lines = []
    for delta in deltas:
        choice = {"index": 0, "delta": delta, "finish_reason": None}
        lines.append({"choices": [choice]})
    if finish:
        lines.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if usage is not None:
        lines[-1]["usage"] = usage  # usage riding on a chunk that has content
    body = b"".join(b"data: " + json.dumps(line).encode() + b"\n\n" for line in lines)
    return body + b"data: [DONE]\n\n"


async def test_reasoning_content_and_think_tags_split_across_chunks() -> None:
    body = chunks(
        {"reasoning_content": "old-style. "},
        {"content": "<th"},
        {"content": "ink>inline thought</thi"},
        {"content": "nk>Answer"},
        usage={
            "prompt_tokens": 75,
            "completion_tokens": 1186,
            "completion_tokens_details": {"reasoning_tokens": 1024},
            "prompt_tokens_details": {"cached_tokens": 64},
        },
    )
    events = await collect(client_for(sse(body)))
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == (
        "old-style. inline thought"
    )
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Answer"
    assert events[-1] == UpstreamUsage(75, 1186, cached_tokens=64, reasoning_tokens=1024)


async def test_retries_429_and_503_before_the_first_token_honouring_retry_after() -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(
                429, json={"error": {"message": "busy"}}, headers={"retry-after": "0"}
            )
        if len(calls) == 2:
            return httpx.Response(503, text="overloaded")
        return httpx.Response(200, content=chunks({"content": "ok"}))

    events = await collect(client_for(handler))
    assert len(calls) == 3
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("ok")]


async def test_gives_up_after_the_attempts() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(InferenceUnavailable):
        await collect(client_for(handler))


async def test_never_retries_after_the_first_token() -> None:
    calls: list[int] = []

    async def broken_stream():  # type: ignore[no-untyped-def]
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'
        raise httpx.ReadError("connection dropped")

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, content=broken_stream())

    seen: list[object] = []
    with pytest.raises(InferenceUnavailable):
        async for event in client_for(handler).stream_chat(REQUEST):
            seen.append(event)
    assert seen == [TextDelta("Hel")] and len(calls) == 1


async def test_stream_without_done_is_an_error() -> None:
    # llama.cpp answers an overflowing streaming prompt with 200 and an empty body.
    with pytest.raises(UpstreamProtocolError):
        await collect(client_for(sse(b"")))


async def test_malformed_json_and_in_band_errors() -> None:
    for line in (b"data: {nope", b'data: {"choices": []} {"choices": []}', b"data: [1, 2]"):
        with pytest.raises(UpstreamProtocolError, match=r"malformed|not a JSON object"):
            await collect(client_for(sse(line + b"\n\n")))
    body = b'data: {"error": {"message": "engine died", "code": "internal"}}\n\ndata: [DONE]\n\n'
    with pytest.raises(InferenceError, match="mid-answer") as raised:
        await collect(client_for(sse(body)))
    assert "engine died" not in str(raised.value)  # the tier's text goes to the log only


async def test_context_length_error_maps_to_its_own_exception() -> None:
    body = wire("llama-cpp-python-0.3.36/error_context_length.json")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, content=body)

    with pytest.raises(ContextLengthExceeded):
        await collect(client_for(handler))


async def test_first_token_timeout() -> None:
    import asyncio

    async def stalled():  # type: ignore[no-untyped-def]
        await asyncio.sleep(5)
        yield b""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=stalled())

    client = client_for(handler, timeouts=Timeouts(first_token=0.05))
    with pytest.raises(InferenceTimeout, match="first token"):
        await collect(client)


async def test_request_body_asks_for_usage_and_streaming() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        assert request.url.path == "/v1/chat/completions"
        return httpx.Response(200, content=chunks({"content": "x"}))

    await collect(client_for(handler))
    assert seen[0]["stream"] is True
    assert seen[0]["stream_options"] == {"include_usage": True}
    assert seen[0]["max_tokens"] == 12


def with_line_separators(transcript: bytes) -> bytes:
    """The recorded vLLM stream with U+2028, U+2029 and U+0085 inside its tokens, written
    raw as vLLM's JSON does (not escaped)."""
    text = transcript.decode()
    for old, new in (
        ('"content":" there"', '"content":"\u2028there"'),
        ('"content":" nice"', '"content":" nice\u2029"'),
        ('"content":" to"', '"content":" \x85to"'),
    ):
        assert old in text
        text = text.replace(old, new)
    return text.encode()


async def test_line_separators_inside_tokens_survive_intact() -> None:
    """SSE ends lines at LF (and CRLF) only: ``str.splitlines`` would cut these chunks."""
    body = with_line_separators(wire("vllm-0.30/chat_stream_usage.sse"))
    events = await collect(client_for(sse(body)))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "Hello\u2028there, nice\u2029 \x85to meet you!"
    assert events[-1] == UpstreamUsage(prompt_tokens=35, completion_tokens=9)


@pytest.mark.parametrize("size", [1, 3, 7, 64])
async def test_lines_split_across_reads_with_crlf(size: int) -> None:
    """Chunk boundaries anywhere (inside a UTF-8 character, between CR and LF) change
    nothing."""
    body = with_line_separators(wire("vllm-0.30/chat_stream_usage.sse")).replace(b"\n", b"\r\n")

    async def pieces():  # type: ignore[no-untyped-def]
        for start in range(0, len(body), size):
            yield body[start : start + size]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=pieces(), headers={"content-type": "text/event-stream"})

    events = await collect(client_for(handler))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "Hello\u2028there, nice\u2029 \x85to meet you!"
    assert Finished("stop") in events


class TrackedBody(httpx.AsyncByteStream):
    """A response body that records whether it was read to its end; ``pause``: seconds
    between chunks (a tier sending token by token)."""

    def __init__(self, *chunks: bytes, pause: float = 0.0) -> None:
        self.chunks = chunks
        self.pause = pause
        self.read_to_end = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            if self.pause:
                await asyncio.sleep(self.pause)
            yield chunk
        self.read_to_end = True


async def test_the_body_is_read_past_done_so_the_connection_is_kept() -> None:
    """httpx closes a connection whose response is closed unread; one read to its end goes
    back to the pool for the next answer (a new connection costs milliseconds of TTFT)."""
    transcript = wire("llama-cpp-python-0.3.36/chat_stream.sse")
    done = transcript.index(b"data: [DONE]")
    body = TrackedBody(transcript[:done], transcript[done:], b"")
    client = client_for(
        lambda request: httpx.Response(
            200, stream=body, headers={"content-type": "text/event-stream"}
        )
    )
    events = await collect(client)
    assert any(isinstance(event, TextDelta) for event in events)
    assert body.read_to_end


async def test_deltas_that_arrive_in_one_read_go_on_as_one() -> None:
    """Tokens read together are merged (each later step then runs once per read, not once
    per token); tokens read apart stay apart, and nothing is lost or reordered."""
    body = chunks({"content": "a"}, {"content": "b"}, {"reasoning_content": "r"}, {"content": "c"})
    together = await collect(client_for(sse(body)))
    assert together[:3] == [TextDelta("ab"), ReasoningDelta("r"), TextDelta("c")]

    lines = [line + b"\n\n" for line in body.split(b"\n\n") if line]
    apart = await collect(
        client_for(
            lambda request: httpx.Response(
                200,
                stream=TrackedBody(*lines, pause=0.02),
                headers={"content-type": "text/event-stream"},
            )
        )
    )
    assert [e for e in apart if isinstance(e, TextDelta)] == [
        TextDelta("a"),
        TextDelta("b"),
        TextDelta("c"),
    ]


async def test_tokens_sent_chunk_by_chunk_faster_than_the_read_interval_go_on_together() -> None:
    """A tier sends each token as its own HTTP chunk. Through the real transport, over a
    socket: past the first token, reads are at least ``read_interval`` apart, and what
    came meanwhile goes on as one delta; the first is never held, and nothing is lost or
    reordered."""
    with fake_upstream() as tier:
        tier.script = Script(tokens=[f" t{n}" for n in range(40)], delay=0.002)
        client = OpenAIClient(base_url=tier.base_url, read_interval=0.03)
        try:
            texts = [e.text for e in await collect(client) if isinstance(e, TextDelta)]
        finally:
            await client.aclose()
    assert "".join(texts) == "".join(f" t{n}" for n in range(40))
    assert texts[0] == " t0" and 2 <= len(texts) < 20


async def test_a_stream_closed_early_closes_its_connection_and_one_read_to_the_end_is_reused() -> (
    None
):
    """Closing the connection is how the tier learns nobody reads the answer any more;
    a body read to its end goes back to the pool for the next answer."""
    with fake_upstream() as tier:
        tier.script = Script(tokens=[f" t{n}" for n in range(200)], delay=0.01)
        client = OpenAIClient(base_url=tier.base_url)
        try:
            async with aclosing(client.stream_chat(REQUEST)) as events:
                await anext(events)
            for _ in range(50):
                if tier.disconnected_at:
                    break
                await asyncio.sleep(0.02)
            assert tier.disconnected_at  # the tier saw the client go
            tier.script = Script()
            for _ in range(2):
                events = await collect(client)
                assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello world."
            first, second, third = tier.ports
            assert second == third != first  # the closed one went; the next one was reused
        finally:
            await client.aclose()


async def test_text_before_an_error_line_in_the_same_read_still_goes_out() -> None:
    body = b'data: {"choices":[{"index":0,"delta":{"content":"partial"}}]}\n\n'
    body += b'data: {"error":{"message":"boom","code":500}}\n\n'
    seen: list[object] = []
    with pytest.raises(InferenceError):
        async for event in client_for(sse(body)).stream_chat(REQUEST):
            seen.append(event)
    assert seen == [TextDelta("partial")]


async def test_an_interrupt_ends_the_wait_for_a_stalled_tier_at_once() -> None:
    """A stop asked while the tier prefills (no token yet) ends the wait then: not at the
    first-token timeout, and not as a failure of the tier (nothing to retry)."""
    from inference import Interrupt
    from inference.errors import Interrupted

    calls: list[int] = []

    async def stalled():  # type: ignore[no-untyped-def]
        await asyncio.sleep(30)
        yield b""

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, content=stalled())

    client = client_for(handler, timeouts=Timeouts(first_token=30.0))
    interrupt = Interrupt()
    asyncio.get_running_loop().call_later(0.05, interrupt)
    with pytest.raises(Interrupted):  # not InferenceTimeout: the 30 s never ran out
        await collect_with(client, interrupt)
    assert calls == [1]  # not retried
    with pytest.raises(Interrupted):  # asked before a read: that read does not begin
        await collect_with(client, interrupt)
    interrupt()  # with no read under way, or twice: nothing to end, no error


async def collect_with(client: OpenAIClient, interrupt: object) -> list[object]:
    stream = client.stream_chat(REQUEST, interrupt=interrupt)  # type: ignore[arg-type]
    return [event async for event in stream]
