"""LentThreads: a request's thread-sensitive sync code on a pooled thread, one request at
a time, given back when the request ends."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from asgiref.sync import sync_to_async

from apps.core.asgi import LentThreads

SCOPE = {"type": "http", "method": "GET", "path": "/"}


async def _noop_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


async def _noop_send(message: Any) -> None:
    pass


def _recording(seen: list[set[int]], *, hold: asyncio.Event | None = None) -> Any:
    """An ASGI app that makes two thread-sensitive calls and records their threads."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        threads = {await sync_to_async(threading.get_ident)()}
        if hold is not None:
            await hold.wait()
        threads.add(await sync_to_async(threading.get_ident)())
        seen.append(threads)

    return app


async def test_a_request_keeps_one_thread_and_the_next_request_reuses_it() -> None:
    seen: list[set[int]] = []
    lent = LentThreads(_recording(seen))
    await lent(SCOPE, _noop_receive, _noop_send)
    await lent(SCOPE, _noop_receive, _noop_send)
    assert [len(threads) for threads in seen] == [1, 1]  # one thread within a request
    assert seen[0] == seen[1]  # lent again, not made again
    assert threading.get_ident() not in seen[0]


async def test_requests_at_once_each_have_a_thread_and_the_pool_keeps_idle_ones() -> None:
    seen: list[set[int]] = []
    hold = asyncio.Event()
    lent = LentThreads(_recording(seen, hold=hold), idle=2)
    requests = [asyncio.create_task(lent(SCOPE, _noop_receive, _noop_send)) for _ in range(3)]
    await asyncio.sleep(0.2)
    hold.set()
    await asyncio.gather(*requests)
    assert len(set().union(*seen)) == 3  # none shared while the three ran at once
    assert len(lent.pool._free) == 2  # the third thread was let go


async def test_a_call_still_running_keeps_its_thread_until_it_returns() -> None:
    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(5)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await sync_to_async(slow)()

    lent = LentThreads(app)
    request = asyncio.create_task(lent(SCOPE, _noop_receive, _noop_send))
    assert await asyncio.to_thread(started.wait, 5)
    request.cancel()  # the client left: the request ends, its call runs on
    await asyncio.gather(request, return_exceptions=True)
    assert lent.pool._free == []  # not lent to another request while busy
    release.set()
    for _ in range(100):
        if lent.pool._free:
            break
        await asyncio.sleep(0.01)
    assert len(lent.pool._free) == 1
