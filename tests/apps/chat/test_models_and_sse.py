"""Model aliases, the context window read from the tier, and keep-alive pings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from apps.chat.services import AnswerEvent, model_resolve
from apps.chat.services.models import _tier_context_window
from apps.chat.sse import with_pings
from apps.core.exceptions import NotFound, UpstreamError
from tests.fake_upstream import FakeUpstream


def test_context_window_comes_from_the_tier_when_not_set(
    upstream: FakeUpstream, settings: Any
) -> None:
    _tier_context_window.cache_clear()
    settings.MODEL_ALIASES = {
        "small": {"served_name": "fake", "context_window": None, "max_output_tokens": 64}
    }
    upstream.script.max_model_len = 32768
    assert model_resolve(alias="small").context_window == 32768
    assert model_resolve(alias="auto").served_name == "fake"
    settings.MODEL_ALIASES = {
        "small": {"served_name": "other", "context_window": None, "max_output_tokens": 64}
    }
    with pytest.raises(UpstreamError, match="no max_model_len"):
        model_resolve(alias=None)
    with pytest.raises(NotFound):
        model_resolve(alias="huge")
    _tier_context_window.cache_clear()


async def test_pings_while_waiting_then_events_in_order() -> None:
    async def slow() -> AsyncIterator[AnswerEvent]:
        yield AnswerEvent(1, "message", {"a": 1})
        await asyncio.sleep(0.35)
        yield AnswerEvent(2, "done", {"b": 2})

    frames = [frame async for frame in with_pings(slow(), every=0.1)]
    assert frames[0].startswith(b"id: 1\r\nevent: message\r\n")
    assert frames[-1].startswith(b"id: 2\r\nevent: done\r\n")
    pings = [f for f in frames if f.startswith(b": ping")]
    assert 2 <= len(pings) <= 4
