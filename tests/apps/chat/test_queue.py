"""The fair queue in front of the tier, through the app against the fake tier.

The tier never serves more than ``INFERENCE_MAX_CONCURRENCY`` answers at once (across
worker processes when the slots live in Redis); a lone request from one team waits for
at most one more of a busy team's; a request that finds no slot in time is a 503
``queue_full`` with ``Retry-After`` before any byte, billed nothing; one whose client
leaves while queued never reaches the tier.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey, api_key_create
from apps.usage import metrics
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord
from tests.apps.chat.conftest import conversation_for, parse_sse
from tests.conftest import reachable_redis_url
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["local", "redis"])
def queue(request: Any, settings: Any) -> str:
    """The slots in this process, then leased in real Redis."""
    settings.INFERENCE_QUEUE_REDIS_URL = reachable_redis_url() if request.param == "redis" else ""
    settings.INFERENCE_MAX_CONCURRENCY = 1
    return str(request.param)


def answer(client: httpx.Client, content: str, *, stream: bool = True) -> dict[str, Any]:
    """Ask in a new conversation; the status, headers and events (or JSON) of the answer."""
    path = f"/api/v1/conversations/{conversation_for(client)}/messages"
    body = {"content": content, "top_k": 0, "stream": stream}
    with client.stream("POST", path, json=body) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            events = [f for f in parse_sse(response.iter_lines()) if "comment" not in f]
            return {"status": response.status_code, "events": events}
        response.read()
        return {
            "status": response.status_code,
            "json": response.json(),
            "headers": response.headers,
        }


def in_background(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(target()))
    thread.start()
    return thread, results


def client_for(url: str, key: IssuedKey) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key.secret}"}
    return httpx.Client(base_url=url, headers=headers, timeout=60)


def wait_until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def queued() -> float:
    return float(metrics.QUEUE_DEPTH._value.get())  # this process: the in-process server


def test_the_tier_serves_at_most_the_limit_at_once(
    queue: str, upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey, settings: Any
) -> None:
    settings.INFERENCE_MAX_CONCURRENCY = 2
    upstream.script.delay = 0.02
    with client_for(asgi_server, issued_key) as client:
        runs = [in_background(lambda n=n: answer(client, f"q{n}")) for n in range(8)]
        for thread, _ in runs:
            thread.join(timeout=60)
    outcomes = [results[0] for _, results in runs]
    assert all(o["status"] == 200 and o["events"][-1]["event"] == "done" for o in outcomes)
    assert len(upstream.requests) == 8
    assert upstream.peak == 2
    waits = [
        next(e["data"]["queue_ms"] for e in o["events"] if e["event"] == "usage") for o in outcomes
    ]
    assert max(waits) > 0  # some waited, and said so in their usage
    assert sorted(UsageRecord.objects.values_list("queue_ms", flat=True)) == sorted(waits)


def test_two_workers_share_one_limit(
    upstream: FakeUpstream,
    asgi_workers: Callable[..., list[str]],
    issued_key: IssuedKey,
    settings: Any,
) -> None:
    urls = asgi_workers(
        count=2,
        INFERENCE_MAX_CONCURRENCY="2",
        INFERENCE_QUEUE_REDIS_URL=reachable_redis_url(),
        INFERENCE_QUEUE_KEY_PREFIX=settings.INFERENCE_QUEUE_KEY_PREFIX,
    )
    upstream.script.delay = 0.02
    runs = []
    for n in range(16):
        url = urls[n % 2]
        runs.append(in_background(lambda url=url: answer(client_for(url, issued_key), "Hi")))
    for thread, _ in runs:
        thread.join(timeout=120)
    outcomes = [results[0] for _, results in runs]
    assert [o["status"] for o in outcomes] == [200] * 16
    assert all(o["events"][-1]["event"] == "done" for o in outcomes)
    assert len(upstream.requests) == 16
    assert upstream.peak == 2


def test_a_lone_team_waits_for_at_most_one_more_of_a_busy_team(
    queue: str,
    upstream: FakeUpstream,
    asgi_server: str,
    issued_key: IssuedKey,
    other_team: Team,
) -> None:
    upstream.script.tokens = [f" w{i}" for i in range(10)]
    upstream.script.delay = 0.05  # about half a second an answer
    busy, lone = issued_key, api_key_create(team=other_team, name="lone")
    with client_for(asgi_server, busy) as busy_client, client_for(asgi_server, lone) as lone_client:
        runs = [in_background(lambda: answer(busy_client, "busy 0"))]
        wait_until(lambda: len(upstream.requests) == 1)
        runs += [in_background(lambda n=n: answer(busy_client, f"busy {n}")) for n in range(1, 6)]
        wait_until(lambda: queued() == 5)
        runs.append(in_background(lambda: answer(lone_client, "lone")))
        for thread, _ in runs:
            thread.join(timeout=60)
    order = [r["messages"][-1]["content"] for r in upstream.requests]
    assert order[0] == "busy 0"
    assert order.index("lone") <= 2, order  # at most one of the busy team's went first


@pytest.mark.parametrize("surface", ["native-sse", "native-json", "openai-sse", "openai-json"])
def test_no_slot_in_time_is_queue_full_before_any_byte_and_bills_nothing(
    queue: str,
    upstream: FakeUpstream,
    asgi_server: str,
    issued_key: IssuedKey,
    settings: Any,
    surface: str,
) -> None:
    settings.INFERENCE_QUEUE_TIMEOUT = 0.3
    Limit.objects.create(team=issued_key.api_key.team, daily_tokens=1_000_000)
    upstream.script.tokens = [f" w{i}" for i in range(40)]
    upstream.script.delay = 0.05  # the answer in service holds the slot about 2 s
    with client_for(asgi_server, issued_key) as client:
        first, _ = in_background(lambda: answer(client, "first"))
        wait_until(lambda: len(upstream.requests) == 1)
        stream = surface.endswith("sse")
        if surface.startswith("native"):
            refused = answer(client, "second", stream=stream)
        else:
            with client.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "model": "small",
                    "messages": [{"role": "user", "content": "second"}],
                    "stream": stream,
                    "rag": {"enabled": False},
                },
            ) as response:
                response.read()
                refused = {
                    "status": response.status_code,
                    "json": response.json(),
                    "headers": response.headers,
                }
        first.join(timeout=30)
    assert refused["status"] == 503, refused
    assert refused["json"]["error"]["code"] == "queue_full"
    assert refused["json"]["error"]["type"] == "overloaded"
    assert int(refused["headers"]["retry-after"]) >= 1
    assert len(upstream.requests) == 1
    assert UsageRecord.objects.filter(kind="chat").count() == 1  # the first answer only
    assert not Reservation.objects.filter(settled_at__isnull=True).exists()
    assert Reservation.objects.filter(actual_tokens=0).count() == 1  # released, not billed
    assert QuotaCounter.objects.get().used == UsageRecord.objects.get().total_tokens


def test_a_client_that_leaves_while_queued_never_reaches_the_tier(
    queue: str, upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey
) -> None:
    upstream.script.tokens = [f" w{i}" for i in range(20)]
    upstream.script.delay = 0.05
    with client_for(asgi_server, issued_key) as client:
        first, _ = in_background(lambda: answer(client, "first"))
        wait_until(lambda: len(upstream.requests) == 1)
        conversation = conversation_for(client)
        with pytest.raises(httpx.ReadTimeout):  # gives up while queued: the socket closes
            client.post(
                f"/api/v1/conversations/{conversation}/messages",
                json={"content": "impatient", "top_k": 0, "stream": True},
                timeout=httpx.Timeout(5, read=0.3),
            )
        wait_until(lambda: queued() == 0)
        first.join(timeout=30)
    time.sleep(0.3)  # had it stayed queued, the slot freed by the first would be its now
    assert [r["messages"][-1]["content"] for r in upstream.requests] == ["first"]
    assert not Reservation.objects.filter(settled_at__isnull=True).exists()
    assert UsageRecord.objects.filter(kind="chat").count() == 1


async def test_a_response_never_begun_settles_and_frees_its_slot(
    queue: str, upstream: FakeUpstream, issued_key: IssuedKey
) -> None:
    """The client leaves between the slot and the first byte: the view returned its
    response, which is never sent (so never iterated). The request's task ending settles
    the run: the tier request closes, the slot is free, nothing stays reserved."""
    from apps.accounts.selectors import caller_for
    from apps.chat.models import Message
    from apps.chat.services import AnswerRequest, answer_prepare, answer_start, model_choose
    from apps.chat.services.tier import slot_acquire
    from apps.core.aio import db_call

    await Limit.objects.acreate(team=issued_key.api_key.team, daily_tokens=1_000_000)
    caller = caller_for(user=None, api_key=issued_key.api_key)
    assert caller is not None
    model = await model_choose(alias=None)
    request = AnswerRequest(caller=caller, model=model, content="Hi", rag=False)
    prepared = await db_call(answer_prepare)(request=request)
    assert prepared.reservation is not None

    async def view() -> None:
        await answer_start(prepared)  # the response built on it is dropped unsent

    await asyncio.create_task(view())
    for _ in range(500):
        if await Reservation.objects.filter(settled_at__isnull=False).aexists():
            break
        await asyncio.sleep(0.02)
    async with asyncio.timeout(5):
        lease = await slot_acquire(team=issued_key.api_key.team, upstream=upstream.base_url)
    await lease.release()
    message = await Message.objects.aget(role=Message.Role.ASSISTANT)
    assert message.status == Message.Status.CANCELLED
    record = await UsageRecord.objects.aget(kind="chat")
    assert record.status == UsageRecord.Status.CANCELLED
    counted = await QuotaCounter.objects.aget()
    assert counted.used == record.total_tokens
