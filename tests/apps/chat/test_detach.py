"""Streams that survive the network (native SSE): a dropped connection detaches the answer,
which goes on for its grace period; a resume with ``Last-Event-ID`` replays what was
missed and continues live, with no gap and no duplicate; nobody back in time, it stops
and bills what it made; a Stop still ends it at once. Through the app and a slow fake
tier, on whichever configuration the suite runs (the embedded default, or PostgreSQL and
Redis), and once through the real llama.cpp tier."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import redis

from apps.accounts.models import Team
from apps.accounts.services import api_key_create
from apps.chat.models import Message
from apps.chat.services.detach import READING_KEY_PREFIX, READING_TTL_SECONDS
from apps.usage.models import Limit, UsageRecord
from inference import FakeTokenizer
from tests.apps.chat.conftest import answer_frames, ask_stream, conversation_for, parse_sse
from tests.apps.chat.test_answers import redis_url
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

TOKENS = [f" w{i}" for i in range(40)]
WHOLE = "".join(TOKENS)


@pytest.fixture(autouse=True, params=["database", "redis"])
def buffer(request: pytest.FixtureRequest, settings: Any) -> str:
    """Each test with the events in the database (the embedded default) and in Redis
    (flushed: message ids restart with every test database)."""
    settings.STREAM_BUFFER_REDIS_URL = redis_url() if request.param == "redis" else ""
    return str(request.param)


@pytest.fixture
def slow(upstream: FakeUpstream) -> FakeUpstream:
    upstream.script.tokens = list(TOKENS)
    upstream.script.delay = 0.05  # 2 s for the whole answer
    return upstream


def drop_after(
    http: httpx.Client, conversation: int, deltas: int, **body: Any
) -> tuple[int, int, str]:
    """Ask, read ``deltas`` deltas, drop the connection: the message id, the last event id
    read and the text read."""
    message_id, last, text = 0, 0, []
    ask = {"content": "Hi", "top_k": 0, **body}
    with answer_frames(http, conversation, **ask) as frames:
        for frame in frames:
            if "id" in frame:
                last = int(frame["id"])
            if frame.get("event") == "message":
                message_id = frame["data"]["message_id"]
            if frame.get("event") == "delta":
                text.append(frame["data"]["text"])
                if len(text) == deltas:
                    break
    return message_id, last, "".join(text)


def resume(
    http: httpx.Client, message_id: int, after: int, *, deltas: int | None = None
) -> tuple[int, str, list[dict[str, Any]]]:
    """Resume after event ``after`` (the ``Last-Event-ID`` header), reading to ``done`` or
    ``deltas`` deltas: the last event id read, the text read, the frames."""
    headers = {"Last-Event-ID": str(after)}
    frames: list[dict[str, Any]] = []
    text: list[str] = []
    with http.stream("GET", f"/api/v1/messages/{message_id}/events", headers=headers) as reply:
        assert reply.status_code == 200, reply.read()
        for frame in parse_sse(reply.iter_lines()):
            if "comment" in frame:
                continue
            frames.append(frame)
            after = int(frame["id"])
            if frame["event"] == "delta":
                text.append(frame["data"]["text"])
                if len(text) == deltas:
                    break
    return after, "".join(text), frames


def ids_follow(frames: list[dict[str, Any]], after: int) -> bool:
    """No gap and no duplicate: each event's id is the one after the last."""
    return [int(f["id"]) for f in frames] == list(range(after + 1, after + 1 + len(frames)))


def test_a_resume_after_a_drop_continues_live_to_the_whole_answer(
    slow: FakeUpstream, http: httpx.Client
) -> None:
    conversation = conversation_for(http)
    message_id, last, before = drop_after(http, conversation, deltas=3)
    assert Message.objects.get(pk=message_id).status in Message.RUNNING
    time.sleep(1)  # a tunnel
    _, after, frames = resume(http, message_id, last)
    assert ids_follow(frames, last)
    assert before + after == WHOLE
    assert frames[-1]["data"]["finish_reason"] == "stop"
    usage = next(f["data"] for f in frames if f["event"] == "usage")
    assert wait_settled(message_id).status == Message.Status.COMPLETE
    record = UsageRecord.objects.get(kind="chat")
    assert record.completion_tokens == usage["completion_tokens"] == len(TOKENS)
    assert record.detached_unread_tokens == 0  # all of it read in the end
    assert slow.disconnected_at == []  # the tier was never cut off


def test_several_drops_in_one_answer(slow: FakeUpstream, http: httpx.Client) -> None:
    conversation = conversation_for(http)
    message_id, last, text = drop_after(http, conversation, deltas=2)
    for _ in range(2):
        time.sleep(0.3)
        before = last
        last, more, frames = resume(http, message_id, last, deltas=4)
        assert ids_follow(frames, before)
        text += more
    last, more, frames = resume(http, message_id, last)
    assert text + more == WHOLE and frames[-1]["event"] == "done"
    assert frames[-1]["data"]["finish_reason"] == "stop"


def test_nobody_back_in_time_stops_the_answer_and_bills_what_it_made(
    slow: FakeUpstream, http: httpx.Client
) -> None:
    conversation = conversation_for(http)
    message_id, _, read = drop_after(http, conversation, deltas=2, stream_grace=1)
    left = time.monotonic()
    while not slow.disconnected_at and time.monotonic() < left + 10:
        time.sleep(0.05)
    assert slow.disconnected_at and slow.disconnected_at[0] - left < 1 + 2
    message = wait_settled(message_id)
    assert message.status == Message.Status.CANCELLED
    assert message.content.startswith(read) and len(message.content) > len(read)
    record = UsageRecord.objects.get(kind="chat")
    made = FakeTokenizer().count(message.content)
    assert record.completion_tokens == made  # exactly the tokens generated
    unread = FakeTokenizer().count(message.content[len(read) :])
    assert 0 < record.detached_unread_tokens <= unread
    assert record.status == UsageRecord.Status.CANCELLED


def test_a_stop_while_detached_ends_it_at_once(slow: FakeUpstream, http: httpx.Client) -> None:
    conversation = conversation_for(http)
    message_id, _, _ = drop_after(http, conversation, deltas=2, stream_grace=60)
    wait_status(message_id, Message.Status.DETACHED)
    stopped = time.monotonic()
    assert http.post(f"/api/v1/messages/{message_id}/cancel").status_code == 202
    message = wait_settled(message_id)
    assert message.status == Message.Status.CANCELLED
    assert slow.disconnected_at and slow.disconnected_at[0] - stopped < 2


def test_a_delete_while_detached_stops_it_and_bills_it(
    slow: FakeUpstream, http: httpx.Client
) -> None:
    conversation = conversation_for(http)
    message_id, _, _ = drop_after(http, conversation, deltas=2, stream_grace=60)
    wait_status(message_id, Message.Status.DETACHED)
    assert http.delete(f"/api/v1/conversations/{conversation}").status_code == 204
    left = time.monotonic()
    while not slow.disconnected_at and time.monotonic() < left + 5:
        time.sleep(0.05)
    assert slow.disconnected_at and not Message.objects.filter(pk=message_id).exists()
    row = UsageRecord.objects.get(kind="chat")
    assert row.status == UsageRecord.Status.CANCELLED and row.completion_tokens > 0


def test_a_polling_client_sees_detached_and_the_text_so_far(
    slow: FakeUpstream, http: httpx.Client
) -> None:
    conversation = conversation_for(http)
    message_id, _, read = drop_after(http, conversation, deltas=2)
    wait_status(message_id, Message.Status.DETACHED)
    time.sleep(0.5)  # more is made, and stored, while nobody reads
    polled = http.get(f"/api/v1/messages/{message_id}").json()
    assert polled["status"] == "detached" and polled["role"] == "assistant"
    assert polled["content"].startswith(read) and len(polled["content"]) > len(read)
    wait_settled(message_id, timeout=30)
    done = http.get(f"/api/v1/messages/{message_id}").json()
    assert (done["status"], done["content"]) == ("complete", WHOLE)


def test_a_detached_answer_holds_its_stream_slot(
    slow: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    Limit.objects.create(team=team, daily_tokens=100_000, max_concurrent_streams=1)
    conversation = conversation_for(http)
    message_id, _, _ = drop_after(http, conversation, deltas=2, stream_grace=60)
    wait_status(message_id, Message.Status.DETACHED)
    refused = http.post(
        f"/api/v1/conversations/{conversation_for(http)}/messages",
        json={"content": "Hi", "top_k": 0},
    )
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "too_many_concurrent_streams"
    http.post(f"/api/v1/messages/{message_id}/cancel")
    wait_settled(message_id)


def test_another_teams_resume_and_poll_are_404(
    slow: FakeUpstream, http: httpx.Client, other_team: Team, asgi_server: str
) -> None:
    conversation = conversation_for(http)
    message_id, last, _ = drop_after(http, conversation, deltas=2)
    key = api_key_create(team=other_team, name="rival")
    headers = {"Authorization": f"Bearer {key.secret}", "Last-Event-ID": str(last)}
    with httpx.Client(base_url=asgi_server, headers=headers, timeout=10) as rival:
        assert rival.get(f"/api/v1/messages/{message_id}/events").status_code == 404
        assert rival.get(f"/api/v1/messages/{message_id}").status_code == 404
    _, rest, _ = resume(http, message_id, last)  # the owner's answer went on regardless
    assert rest and WHOLE.endswith(rest)


def test_a_reader_in_another_process_holds_the_answer_past_its_grace(
    slow: FakeUpstream, http: httpx.Client, buffer: str, settings: Any
) -> None:
    """Several web processes: the resume may land in another one, which says in Redis
    that it reads; the answer's process goes on while the mark is fresh."""
    if buffer != "redis":
        pytest.skip("without Redis only a resume in the answer's own process holds it")
    slow.script.tokens = [f" w{i}" for i in range(300)]  # 15 s
    message_id, _, _ = drop_after(http, conversation_for(http), deltas=2, stream_grace=0.5)
    client = redis.Redis.from_url(settings.STREAM_BUFFER_REDIS_URL)
    key = f"{READING_KEY_PREFIX}{message_id}"
    try:
        until = time.monotonic() + 2
        while time.monotonic() < until:  # what the other process's resume does
            client.set(key, 1, px=int(READING_TTL_SECONDS * 1000))
            time.sleep(0.3)
        assert slow.disconnected_at == []  # past its grace: it goes on
        client.delete(key)  # that reader left
        left = time.monotonic()
        while not slow.disconnected_at and time.monotonic() < left + READING_TTL_SECONDS + 3:
            time.sleep(0.05)
        assert slow.disconnected_at, "the answer went on with nobody reading"
    finally:
        client.close()
    assert wait_settled(message_id).status == Message.Status.CANCELLED


def test_the_openai_surface_still_stops_when_its_client_goes(
    slow: FakeUpstream, http: httpx.Client
) -> None:
    body = {"model": "small", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    body |= {"store": True, "rag": {"enabled": False}}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if '"content": " w1"' in line or '"content":" w1"' in line:
                break
    left = time.monotonic()
    while not slow.disconnected_at and time.monotonic() < left + 5:
        time.sleep(0.05)
    assert slow.disconnected_at and slow.disconnected_at[0] - left < 2


def test_an_answer_that_ends_while_detached_replays_whole(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.script.tokens, upstream.script.delay = list(TOKENS[:10]), 0.05
    conversation = conversation_for(http)
    message_id, last, before = drop_after(http, conversation, deltas=1)
    wait_settled(message_id)
    _, after, frames = resume(http, message_id, last)
    assert before + after == "".join(TOKENS[:10]) and ids_follow(frames, last)
    record = UsageRecord.objects.get(kind="chat")  # settled before the resume
    assert record.detached_unread_tokens == 9  # settled before anyone came back


@pytest.mark.integration
def test_a_resume_through_the_real_tier(
    llama_server: str, settings: Any, http: httpx.Client
) -> None:
    settings.INFERENCE_BASE_URL = llama_server
    settings.INFERENCE_SERVER = "llama.cpp"
    settings.RESPONSE_CACHE_TTL = 0
    question = {
        "content": "Count from one to twenty, in words, separated by commas.",
        "top_k": 0,
        "temperature": 0,
        "seed": 1,
        "max_tokens": 40,
    }
    whole = "".join(
        f["data"]["text"]
        for f in ask_stream(http, conversation_for(http), **question)
        if f["event"] == "delta"
    )
    message_id, last, before = drop_after(http, conversation_for(http), deltas=2, **question)
    time.sleep(0.5)
    _, after, frames = resume(http, message_id, last)
    assert before + after == whole and ids_follow(frames, last)
    assert frames[-1]["event"] == "done"


def wait_status(message_id: int, status: str, timeout: float = 5) -> Message:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = Message.objects.get(pk=message_id)
        if message.status == status:
            return message
        time.sleep(0.05)
    raise AssertionError(f"message {message_id} is {message.status}, not {status}")


def wait_settled(message_id: int, timeout: float = 10) -> Message:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = Message.objects.get(pk=message_id)
        if message.status not in Message.RUNNING:
            return message
        time.sleep(0.05)
    raise AssertionError(f"message {message_id} still running")
