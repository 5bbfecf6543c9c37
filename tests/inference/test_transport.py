"""The client's aiohttp transport over a real socket: what each failure becomes."""

from __future__ import annotations

import asyncio
import socket
import ssl

import httpx
import pytest

from inference import ChatRequest, OpenAIClient, Retry, TextDelta, Timeouts
from inference.errors import InferenceTimeout, InferenceUnavailable
from inference.transport import READ_ON_DEMAND, AiohttpTransport
from tests.fake_upstream import Script, fake_upstream

REQUEST = ChatRequest(model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=12)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def texts(client: OpenAIClient, seen: list[str]) -> None:
    try:
        async for event in client.stream_chat(REQUEST, retry=Retry(attempts=1)):
            if isinstance(event, TextDelta):
                seen.append(event.text)
    finally:
        await client.aclose()


async def test_a_refused_connection_is_unavailable_not_a_timeout() -> None:
    client = OpenAIClient(base_url=f"http://127.0.0.1:{closed_port()}/v1")
    with pytest.raises(InferenceUnavailable) as raised:
        await texts(client, [])
    assert isinstance(raised.value.__cause__, httpx.ConnectError)


async def test_a_connection_dropped_mid_stream_is_unavailable_after_the_text_before_it() -> None:
    """The read after the first waits (``read_interval``), so the break has arrived by
    then, behind "b": "b" still goes out, then the error."""
    seen: list[str] = []
    with fake_upstream() as tier, pytest.raises(InferenceUnavailable) as raised:
        tier.script = Script(tokens=["a", "b", "c"], drop_after=2)
        await texts(OpenAIClient(base_url=tier.base_url, read_interval=0.3), seen)
    assert "".join(seen) == "ab"
    assert isinstance(raised.value.__cause__, httpx.RemoteProtocolError)


async def test_a_tier_that_goes_quiet_times_out_on_the_idle_limit() -> None:
    with fake_upstream() as tier, pytest.raises(InferenceTimeout):
        tier.script = Script(tokens=["a", "b"], stall_after=1)
        client = OpenAIClient(base_url=tier.base_url, timeouts=Timeouts(idle=0.3))
        await texts(client, [])


async def test_headers_body_and_status_of_a_plain_request_come_through() -> None:
    with fake_upstream() as tier:
        tier.script = Script(fail_status=429, retry_after="7", fail_times=1, api_key="sk-tier")
        client = OpenAIClient(base_url=tier.base_url, api_key="sk-tier")
        try:
            models = await client.models()
            response = await client._http.post("chat/completions", json=REQUEST.body())
        finally:
            await client.aclose()
    assert models  # a JSON body read whole, past the tier's key check
    assert (response.status_code, response.headers["retry-after"]) == (429, "7")
    assert response.json()["error"]["message"] == "busy"
    assert tier.requests[-1]["messages"] == [{"role": "user", "content": "hi"}]


async def received_while_held(*, on_demand: bool) -> tuple[int, bytes]:
    """Bytes the transport took from the socket while the body's consumer held between its
    first read and the next, and the rest of the body."""
    with fake_upstream() as tier:
        tier.script = Script(tokens=list("abcdefgh"), delay=0.01)
        transport = AiohttpTransport(ssl_context=ssl.create_default_context())
        extensions = {READ_ON_DEMAND: True} if on_demand else {}
        request = httpx.Request(
            "POST",
            f"{tier.base_url}/chat/completions",
            json={**REQUEST.body(), "stream": True},
            extensions=extensions,
        )
        try:
            response = await transport.handle_async_request(request)
            body = response.stream
            reads = aiter(body)
            await anext(reads)
            content = body._response.content  # type: ignore[attr-defined]
            before = content.total_bytes
            await asyncio.sleep(0.3)  # the tier sends every other token meanwhile
            held = content.total_bytes - before
            rest = b"".join([chunk async for chunk in reads])
        finally:
            await transport.aclose()
    return held, rest


async def test_a_body_read_on_demand_stays_in_the_socket_while_its_consumer_holds() -> None:
    held, rest = await received_while_held(on_demand=True)
    assert held == 0
    assert rest.count(b"data:") >= 7 and rest.rstrip().endswith(b"data: [DONE]")
    held, _ = await received_while_held(on_demand=False)  # the control: read as it comes
    assert held > 0


async def test_a_consumer_holding_longer_than_the_idle_limit_is_not_the_tier_going_quiet() -> None:
    """Read on demand, nothing is read while the client holds (its ``read_interval``):
    the silence it then meets is its own, and the idle limit times the tier's alone."""
    seen: list[str] = []
    with fake_upstream() as tier:
        tier.script = Script(tokens=["a", "b", "c"], delay=0.05)
        client = OpenAIClient(
            base_url=tier.base_url, timeouts=Timeouts(idle=0.2), read_interval=0.5
        )
        await texts(client, seen)
    assert "".join(seen) == "abc"
