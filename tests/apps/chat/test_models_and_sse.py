"""Model aliases, the context window read from the tier, and keep-alive pings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from apps.chat.services import model_resolve
from apps.chat.services.tier import _windows
from apps.chat.services.types import Done, Started
from apps.chat.sse import frame, with_pings
from apps.core.exceptions import NotFound, UpstreamError
from tests.fake_upstream import FakeUpstream


async def test_context_window_comes_from_the_tier_when_not_set(
    upstream: FakeUpstream, settings: Any
) -> None:
    _windows.clear()
    settings.MODEL_ALIASES = {
        "small": {"served_name": "fake", "context_window": None, "max_output_tokens": 64}
    }
    upstream.script.max_model_len = 32768
    assert (await model_resolve(alias="small")).context_window == 32768
    auto = await model_resolve(alias="auto")
    assert (auto.served_name, auto.alias) == ("fake", "small")  # priced as what served
    settings.MODEL_ALIASES = {
        "small": {"served_name": "other", "context_window": None, "max_output_tokens": 64}
    }
    with pytest.raises(UpstreamError, match="no max_model_len"):
        await model_resolve(alias=None)
    with pytest.raises(NotFound):
        await model_resolve(alias="huge")
    _windows.clear()


async def test_pings_while_waiting_then_events_in_order() -> None:
    async def slow() -> AsyncIterator[bytes]:
        yield frame(Started(id=1, message_id=1, conversation_id=1, model="small"))
        await asyncio.sleep(0.35)
        yield frame(Done(id=2, message_id=1, finish_reason="stop"))

    frames = [chunk async for chunk in with_pings(slow(), every=0.1)]
    assert frames[0].startswith(b"id: 1\r\nevent: message\r\n")
    assert frames[-1].startswith(b"id: 2\r\nevent: done\r\n")
    pings = [f for f in frames if f.startswith(b": ping")]
    assert 2 <= len(pings) <= 4


async def test_a_frame_goes_out_before_the_next_is_asked_for_when_the_writer_waits() -> None:
    """The first token leaves at once: the producer does not first pull the next frame
    down the whole chain (the tier read, its parse) while the writer waits."""
    order: list[str] = []

    async def frames() -> AsyncIterator[bytes]:
        for number in range(3):
            yield b"%d" % number
            order.append(f"asked after {number}")  # reading on, down to the tier
            await asyncio.sleep(0.01)  # the tier's next token

    async for chunk in with_pings(frames(), every=10):
        order.append(f"sent {chunk.decode()}")
    assert order[:4] == ["sent 0", "asked after 0", "sent 1", "asked after 1"]
