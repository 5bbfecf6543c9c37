"""Fallback before the first token, across upstreams of recorded wire shapes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from inference import (
    AllUpstreamsDown,
    BreakerPolicy,
    ChatRequest,
    CircuitBreaker,
    CircuitState,
    ContextLengthExceeded,
    Failover,
    InferenceUnavailable,
    LocalBreakerStore,
    OpenAIClient,
    Retry,
    Target,
    TextDelta,
    Timeouts,
    UpstreamProtocolError,
)
from tests.inference.test_client import wire

REQUEST = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=12)
STREAM = wire("llama-cpp-python-0.3.36/chat_stream.sse")
Handler = Callable[[httpx.Request], httpx.Response]


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=STREAM, headers={"content-type": "text/event-stream"})


def status(code: int) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(code, json={"error": {"message": "no", "type": "server_error"}})

    return handler


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def context_error(request: httpx.Request) -> httpx.Response:
    return httpx.Response(400, content=wire("vllm-0.30/error_context_length.json"))


class Tier:
    """Upstreams by URL, each a MockTransport handler; counts requests per upstream."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers
        self.calls: dict[str, int] = dict.fromkeys(handlers, 0)
        self.clients: dict[str, OpenAIClient] = {}

    def client(self, target: Target) -> OpenAIClient:
        url = target.upstream
        if url not in self.clients:

            def handler(request: httpx.Request) -> httpx.Response:
                self.calls[url] += 1
                return self.handlers[url](request)

            self.clients[url] = OpenAIClient(
                base_url=url,
                transport=httpx.MockTransport(handler),
                retry=Retry(attempts=3, base_delay=0.0, max_delay=0.0),
                timeouts=Timeouts(first_token=0.2),
            )
        return self.clients[url]


def targets(*pairs: tuple[str, str]) -> list[Target]:
    return [
        Target(
            alias=alias,
            upstream=url,
            request=REQUEST.for_model(
                model=f"{alias}-model", max_tokens=12, reasoning_opened=False
            ),
        )
        for alias, url in pairs
    ]


def breaker() -> CircuitBreaker:
    return CircuitBreaker(store=LocalBreakerStore(), policy=BreakerPolicy(failures=2))


async def run(failover: Failover) -> tuple[str, list[str]]:
    switched: list[str] = []

    async def switch(target: Target) -> None:
        switched.append(target.upstream)

    await failover.first()
    text = "".join(
        [e.text async for e in failover.stream(switch=switch) if isinstance(e, TextDelta)]
    )
    return text, switched


@pytest.mark.parametrize("failure", [status(503), refused], ids=["503", "connect"])
async def test_a_failed_upstream_hands_over_to_the_next_then_to_the_fallback_alias(
    failure: Handler,
) -> None:
    tier = Tier({"http://a/v1": failure, "http://b/v1": failure, "http://c/v1": ok})
    plan = targets(("small", "http://a/v1"), ("small", "http://b/v1"), ("large", "http://c/v1"))
    failover = Failover(plan, breaker=breaker(), client=tier.client)
    text, switched = await run(failover)
    assert text and switched == ["http://b/v1", "http://c/v1"]
    assert failover.served == plan[2] and failover.served.request.model == "large-model"
    assert failover.tried == plan  # each one a request went to, in order
    # Not the last in line: one attempt each, no retry on the same upstream.
    assert tier.calls == {"http://a/v1": 1, "http://b/v1": 1, "http://c/v1": 1}


async def test_the_last_upstream_keeps_its_retries_and_its_error() -> None:
    tier = Tier({"http://a/v1": status(502), "http://b/v1": status(503)})
    failover = Failover(
        targets(("small", "http://a/v1"), ("small", "http://b/v1")),
        breaker=breaker(),
        client=tier.client,
    )
    with pytest.raises(InferenceUnavailable):
        await run(failover)
    assert tier.calls == {"http://a/v1": 1, "http://b/v1": 3}


async def test_an_error_in_the_request_itself_is_not_retried_elsewhere() -> None:
    tier = Tier({"http://a/v1": context_error, "http://b/v1": ok})
    failover = Failover(
        targets(("small", "http://a/v1"), ("small", "http://b/v1")),
        breaker=breaker(),
        client=tier.client,
    )
    with pytest.raises(ContextLengthExceeded):
        await run(failover)
    assert tier.calls["http://b/v1"] == 0


async def test_no_fallback_after_the_first_token() -> None:
    cut = b"\n\n".join(STREAM.split(b"\n\n")[:2]) + b"\n\n"  # role, "The", then the end

    def dropped(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=cut, headers={"content-type": "text/event-stream"})

    tier = Tier({"http://a/v1": dropped, "http://b/v1": ok})
    failover = Failover(
        targets(("small", "http://a/v1"), ("small", "http://b/v1")),
        breaker=breaker(),
        client=tier.client,
    )
    switched: list[Target] = []
    seen: list[str] = []

    async def switch(target: Target) -> None:
        switched.append(target)

    await failover.first()
    with pytest.raises(UpstreamProtocolError, match="without \\[DONE\\]"):
        async for event in failover.stream(switch=switch):
            seen.append(getattr(event, "text", ""))
    assert seen == ["The"] and not switched
    assert tier.calls["http://b/v1"] == 0


async def test_a_black_holed_upstream_opens_its_circuit_and_is_skipped_after() -> None:
    async def never(request: httpx.Request) -> httpx.Response:
        async def body():  # type: ignore[no-untyped-def]
            await asyncio.sleep(3600)
            yield b""

        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    tier = Tier({"http://a/v1": never, "http://b/v1": ok})  # type: ignore[dict-item]
    shared = breaker()
    plan = targets(("small", "http://a/v1"), ("small", "http://b/v1"))
    for _ in range(2):  # each pays the first-token timeout once, then moves on
        text, switched = await run(Failover(plan, breaker=shared, client=tier.client))
        assert text and switched == ["http://b/v1"]
    assert await shared.state("http://a/v1") is CircuitState.OPEN
    skipping = Failover(plan, breaker=shared, client=tier.client)
    text, switched = await run(skipping)
    assert text and switched == []  # straight to b: the open circuit costs nothing
    assert skipping.tried == [plan[1]]  # a skipped upstream was never tried
    assert tier.calls == {"http://a/v1": 2, "http://b/v1": 3}


async def test_every_circuit_open_refuses_before_anything_is_sent() -> None:
    shared = breaker()
    for _ in range(2):
        await shared.failure("http://a/v1")
    tier = Tier({"http://a/v1": ok})
    with pytest.raises(AllUpstreamsDown):
        await Failover(
            targets(("small", "http://a/v1")), breaker=shared, client=tier.client
        ).first()
    assert tier.calls == {"http://a/v1": 0}
