"""A client that leaves while its answer is being prepared (retrieval, counting, the
admission step, all in a thread) leaves no hold behind: the reservation the preparation
made is given back as soon as it finishes, not held until it expires."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from apps.chat.services import run as run_module

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_client_gone_during_prepare_gives_the_hold_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settled: list[tuple[Any, int]] = []

    def slow_prepare(*, request: Any) -> Any:
        time.sleep(0.3)  # the search and the admission step, in their thread
        return SimpleNamespace(reservation="hold-1")

    def settle(*, reservation: Any, actual: int) -> None:
        settled.append((reservation, actual))

    monkeypatch.setattr(run_module, "answer_prepare", slow_prepare)
    monkeypatch.setattr(run_module, "budget_settle", settle)
    asking = asyncio.ensure_future(run_module.answer_ready(SimpleNamespace()))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    asking.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await asking
    for _ in range(50):
        if settled:
            break
        await asyncio.sleep(0.05)
    assert settled == [("hold-1", 0)]


async def test_a_client_that_stays_gets_its_prepared_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(run_module, "answer_prepare", lambda *, request: "prepared")
    assert await run_module.answer_ready(SimpleNamespace()) == "prepared"  # type: ignore[arg-type]
