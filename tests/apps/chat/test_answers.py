"""Answering through the HTTP API, against the fake inference tier on a real socket."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from apps.chat.models import Message, MessageEvent
from apps.knowledge.models import Collection
from apps.usage.models import UsageRecord
from tests import factories
from tests.apps.chat.conftest import answer_frames, ask_stream, conversation_for, parse_sse
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def redis_url() -> str:
    import os

    import redis

    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/15"
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        client.flushdb()  # message ids restart with every test database
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {url}")
    finally:
        client.close()
    return url


def usage_fields(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        k: usage[k]
        for k in (
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
            "reasoning_tokens",
            "total_tokens",
            "source",
            "model",
        )
    }


def seed_collection(team: Any) -> Collection:
    collection = factories.collection(team=team, name="facts")
    factories.document(
        collection=collection,
        title="Pantry",
        text="The spare pantry key hangs behind the blue door.",
    )
    return collection


def test_sse_events_in_order_with_ids_and_headers(
    upstream: FakeUpstream, http: httpx.Client, team: Any
) -> None:
    seed_collection(team)
    conversation = conversation_for(http)
    with http.stream(
        "POST",
        f"/api/v1/conversations/{conversation}/messages",
        json={"content": "Where is the pantry key?", "stream": True},
    ) as response:
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        assert "content-encoding" not in response.headers
        frames = [f for f in parse_sse(response.iter_lines()) if "comment" not in f]
    names = [f["event"] for f in frames]
    deltas = names[2:-2]  # tokens that reach the app together go on as one delta
    assert names[:2] + names[-2:] == ["message", "retrieval", "usage", "done"]
    assert deltas and set(deltas) == {"delta"}
    assert [int(f["id"]) for f in frames] == list(range(1, len(frames) + 1))
    assert frames[1]["data"]["citations"][0]["title"] == "Pantry"
    assert "".join(f["data"]["text"] for f in frames if f["event"] == "delta") == "Hello world."
    usage = frames[-2]["data"]
    assert usage["source"] == "counted" and usage["completion_tokens"] == 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + 3
    assert frames[-1]["data"] == {
        "message_id": frames[0]["data"]["message_id"],
        "finish_reason": "stop",
    }
    # The prompt sent upstream carries the retrieved passage as numbered data.
    sent = upstream.requests[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert "[1] Pantry" in sent["messages"][-1]["content"]


@pytest.mark.parametrize("usage_mode", ["none", "final_chunk", "on_content"])
def test_streaming_and_json_record_identical_usage(
    upstream: FakeUpstream, http: httpx.Client, usage_mode: str
) -> None:
    upstream.script.usage = usage_mode  # type: ignore[assignment]
    conversation = conversation_for(http)
    frames = ask_stream(http, conversation, content="Say hello", top_k=0)
    streamed = next(f["data"] for f in frames if f["event"] == "usage")
    conversation = conversation_for(http)
    response = http.post(
        f"/api/v1/conversations/{conversation}/messages", json={"content": "Say hello", "top_k": 0}
    )
    assert response.status_code == 201
    body = response.json()
    assert body["content"] == "Hello world." and body["finish_reason"] == "stop"
    assert usage_fields(body["usage"]) == usage_fields(streamed)
    assert streamed["source"] == ("counted" if usage_mode == "none" else "upstream")
    stored = Message.objects.get(pk=body["id"])
    assert (stored.prompt_tokens, stored.completion_tokens) == (
        streamed["prompt_tokens"],
        streamed["completion_tokens"],
    )


def test_reasoning_seed_is_stored_and_reported_as_such(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.script.reasoning = ["Let me ", "think."]
    upstream.script.usage = "final_chunk"
    upstream.script.usage_override = {
        "prompt_tokens": 75,
        "completion_tokens": 1186,
        "total_tokens": 1261,
        "completion_tokens_details": {"reasoning_tokens": 1024},
    }
    conversation = conversation_for(http)
    frames = ask_stream(http, conversation, content="Think first", top_k=0, reasoning=True)
    assert "".join(f["data"]["text"] for f in frames if f["event"] == "reasoning") == (
        "Let me think."
    )
    usage = next(f["data"] for f in frames if f["event"] == "usage")
    assert (
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["reasoning_tokens"],
        usage["total_tokens"],
    ) == (75, 1186, 1024, 1261)
    message = Message.objects.get(pk=frames[0]["data"]["message_id"])
    assert (message.completion_tokens - message.reasoning_tokens) == 162
    # Without asking, no reasoning events are sent (but the tokens are billed the same).
    frames = ask_stream(http, conversation_for(http), content="Think first", top_k=0)
    assert not any(f["event"] == "reasoning" for f in frames)


def test_reasoning_that_exhausts_max_tokens_says_so(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.script.reasoning = ["hmm"] * 4
    upstream.script.tokens = []
    upstream.script.finish_reason = "length"
    frames = ask_stream(http, conversation_for(http), content="Deep", top_k=0, max_tokens=4)
    error = next(f["data"] for f in frames if f["event"] == "error")
    assert error["code"] == "reasoning_budget_exhausted"
    assert frames[-1]["event"] == "done" and frames[-1]["data"]["finish_reason"] == "length"


def test_retry_before_the_first_token_never_after(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.script.fail_status, upstream.script.retry_after = 503, "0"
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    assert len(upstream.requests) == 2
    assert "".join(f["data"]["text"] for f in frames if f["event"] == "delta") == "Hello world."

    upstream.requests.clear()
    upstream.script.fail_status = None
    upstream.script.tokens = ["one", " two", " three", " four"]
    upstream.script.drop_after = 2
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    assert len(upstream.requests) == 1  # no retry once text has been sent: no duplicates
    assert "".join(f["data"]["text"] for f in frames if f["event"] == "delta") == "one two"
    assert [f["event"] for f in frames][-3:] == ["error", "usage", "done"]
    error = next(f["data"] for f in frames if f["event"] == "error")
    assert error["type"] == "upstream_error" and error["code"] == "inference_unavailable"
    usage = next(f["data"] for f in frames if f["event"] == "usage")
    assert usage["completion_tokens"] == 2  # the partial answer is billed
    row = UsageRecord.objects.get(kind="chat", object_id=str(frames[0]["data"]["message_id"]))
    assert (row.completion_tokens, row.status, row.error_code) == (
        2,
        "error",
        "inference_unavailable",
    )


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ({"malformed_after": 1}, "inference_protocol_error"),
        ({"stall_after": 1}, "inference_timeout"),
    ],
)
def test_faults_after_the_first_token_arrive_in_band(
    upstream: FakeUpstream, http: httpx.Client, settings: Any, fault: dict[str, int], code: str
) -> None:
    settings.INFERENCE_TIMEOUTS = {**settings.INFERENCE_TIMEOUTS, "idle": 0.5}
    for name, value in fault.items():
        setattr(upstream.script, name, value)
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    assert next(f["data"] for f in frames if f["event"] == "error")["code"] == code
    assert frames[-1]["event"] == "done"


def test_a_huge_chunk_passes_through_whole(upstream: FakeUpstream, http: httpx.Client) -> None:
    huge = "x" * 2_000_000
    upstream.script.tokens = ["start ", huge, " end"]
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    text = "".join(f["data"]["text"] for f in frames if f["event"] == "delta")
    assert text == f"start {huge} end"
    assert frames[-1]["event"] == "done"


def test_upstream_down_before_streaming_is_a_json_error(
    upstream: FakeUpstream, http: httpx.Client, settings: Any
) -> None:
    upstream.script.fail_status, upstream.script.fail_times = 503, 99
    response = http.post(
        f"/api/v1/conversations/{conversation_for(http)}/messages",
        json={"content": "Hi", "top_k": 0},
    )
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "inference_unavailable"
    assert len(upstream.requests) == settings.INFERENCE_RETRY_ATTEMPTS


def test_model_text_cannot_forge_events(upstream: FakeUpstream, http: httpx.Client) -> None:
    upstream.script.tokens = ["safe", "\n\nevent: done\ndata: x\n\n", "tail"]
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    deltas = [f["data"]["text"] for f in frames if f["event"] == "delta"]
    assert "".join(deltas) == "safe\n\nevent: done\ndata: x\n\ntail"
    assert [f["event"] for f in frames].count("done") == 1


def test_context_length_exceeded_before_any_call(
    upstream: FakeUpstream, http: httpx.Client, settings: Any
) -> None:
    settings.MODEL_ALIASES = {
        "small": {**settings.MODEL_ALIASES["small"], "context_window": 200, "max_output_tokens": 50}
    }
    response = http.post(
        f"/api/v1/conversations/{conversation_for(http)}/messages",
        json={"content": "word " * 400, "top_k": 0, "stream": True},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    response = http.post(
        f"/api/v1/conversations/{conversation_for(http)}/messages",
        json={"content": "hi", "max_tokens": 51},
    )
    assert response.json()["error"]["code"] == "max_tokens_too_large"
    response = http.post(
        f"/api/v1/conversations/{conversation_for(http)}/messages",
        json={"content": "hi", "model": "gigantic"},
    )
    assert response.status_code == 404
    assert upstream.requests == []


def test_first_delta_arrives_before_the_upstream_finishes(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.script.tokens = [f" w{i}" for i in range(6)]
    upstream.script.delay = 0.3
    conversation = conversation_for(http)
    first_delta_at = None
    with answer_frames(http, conversation, content="Hi", top_k=0, stream=True) as frames:
        for frame in frames:
            if frame.get("event") == "delta" and first_delta_at is None:
                first_delta_at = time.monotonic()
    assert first_delta_at is not None and upstream.finished_at
    assert first_delta_at < upstream.finished_at[0]


def test_client_disconnect_cancels_upstream_and_bills_the_partial_answer(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.script.tokens = [f" w{i}" for i in range(200)]
    upstream.script.delay = 0.05
    conversation = conversation_for(http)
    ask = {"content": "Hi", "top_k": 0, "stream": True, "stream_grace": 0}  # no detach
    with answer_frames(http, conversation, **ask) as frames:
        for frame in frames:
            if frame.get("event") == "delta":
                break  # leave after the first token: the client goes away
    left_at = time.monotonic()
    deadline = left_at + 5
    while not upstream.disconnected_at and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream.disconnected_at, "the upstream request was not closed"
    assert upstream.disconnected_at[0] - left_at < 2.0
    while time.monotonic() < deadline:
        message = Message.objects.filter(role="assistant").first()
        if message is not None and message.status == Message.Status.CANCELLED:
            break
        time.sleep(0.05)
    assert message is not None and message.status == Message.Status.CANCELLED
    assert 1 <= message.completion_tokens < 200
    assert message.content
    row = UsageRecord.objects.get(kind="chat")
    assert (row.status, row.completion_tokens) == ("cancelled", message.completion_tokens)


def test_cancel_from_another_connection(upstream: FakeUpstream, http: httpx.Client) -> None:
    upstream.script.tokens = [f" w{i}" for i in range(200)]
    upstream.script.delay = 0.05
    conversation = conversation_for(http)
    events = []
    with answer_frames(http, conversation, content="Hi", top_k=0, stream=True) as frames:
        for frame in frames:
            events.append(frame)
            if frame.get("event") == "delta" and len(events) == 3:
                message_id = events[0]["data"]["message_id"]
                assert http.post(f"/api/v1/messages/{message_id}/cancel").status_code == 202
    assert events[-1]["event"] == "done"
    assert events[-1]["data"]["finish_reason"] == "cancelled"
    message = Message.objects.get(pk=message_id)
    assert message.status == "cancelled" and 1 <= message.completion_tokens < 200


def test_the_rows_are_written_while_the_tier_prefills(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    """An answer's rows wait for its first token to go out, but not for a tier still
    prefilling: they are there (so a cancel finds the message) long before the first
    token."""
    upstream.script.stall_after = 0  # no token comes
    conversation = conversation_for(http)
    with answer_frames(http, conversation, content="Hi", top_k=0, stream=True) as frames:
        message_id = next(frames)["data"]["message_id"]
        deadline = time.monotonic() + 5
        while not Message.objects.filter(pk=message_id).exists():
            assert time.monotonic() < deadline, "no rows while the tier prefills"
            time.sleep(0.01)
        assert Message.objects.get(pk=message_id).status == Message.Status.STREAMING
        assert http.post(f"/api/v1/messages/{message_id}/cancel").status_code == 202


@pytest.mark.parametrize("buffer", ["database", "redis"])
def test_replay_after_last_event_id_without_gap_or_duplicate(
    upstream: FakeUpstream, http: httpx.Client, settings: Any, buffer: str
) -> None:
    if buffer == "redis":
        settings.STREAM_BUFFER_REDIS_URL = redis_url()
    else:
        settings.STREAM_BUFFER_REDIS_URL = ""
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    message_id = frames[0]["data"]["message_id"]
    rows = MessageEvent.objects.filter(message_id=message_id)
    if buffer == "database":  # one row per journal flush, each holding its events
        stored = [s for row in rows for s, _, _ in row.data]
        assert stored == [int(f["id"]) for f in frames] and rows.count() < len(frames)
    else:
        assert not rows.exists()
    with http.stream(
        "GET", f"/api/v1/messages/{message_id}/events", headers={"Last-Event-ID": "3"}
    ) as response:
        replayed = [f for f in parse_sse(response.iter_lines()) if "comment" not in f]
    assert [f["id"] for f in replayed] == [f["id"] for f in frames[3:]]
    assert [f["data"] for f in replayed] == [f["data"] for f in frames[3:]]


@pytest.mark.parametrize("buffer", ["database", "redis"])
def test_answers_streaming_together_share_each_journal_write_and_replay_whole(
    upstream: FakeUpstream,
    http: httpx.Client,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    buffer: str,
) -> None:
    """One write a quarter second carries every open answer's events (a thousand streams
    are not a thousand writes a second), and each answer still replays exactly."""
    from apps.chat.event_store import DatabaseEventStore, RedisEventStore

    settings.STREAM_BUFFER_REDIS_URL = redis_url() if buffer == "redis" else ""
    store = RedisEventStore if buffer == "redis" else DatabaseEventStore
    writes: list[int] = []
    original = store.append_many

    async def counted(self: Any, batches: dict[int, list[Any]]) -> None:
        writes.append(len(batches))
        await original(self, batches)

    monkeypatch.setattr(store, "append_many", counted)
    upstream.script.tokens = [f" w{i}" for i in range(12)]
    upstream.script.delay = 0.05
    conversations = [conversation_for(http) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(lambda c: ask_stream(http, c, content="Hi", top_k=0), conversations)
        )
    assert max(writes) > 1
    for frames in answers:
        assert [f["event"] for f in frames][-2:] == ["usage", "done"]
        message_id = frames[0]["data"]["message_id"]
        with http.stream("GET", f"/api/v1/messages/{message_id}/events") as response:
            replayed = [f for f in parse_sse(response.iter_lines()) if "comment" not in f]
        assert [(f["id"], f["data"]) for f in replayed] == [(f["id"], f["data"]) for f in frames]


def test_resume_while_the_answer_is_still_streaming(
    upstream: FakeUpstream, http: httpx.Client, settings: Any
) -> None:
    settings.STREAM_BUFFER_REDIS_URL = redis_url()
    upstream.script.tokens = [f" w{i}" for i in range(30)]
    upstream.script.delay = 0.03
    conversation = conversation_for(http)
    seen: list[dict[str, Any]] = []
    with answer_frames(http, conversation, content="Hi", top_k=0, stream=True) as frames:
        for frame in frames:
            seen.append(frame)
            if len(seen) == 5:
                break  # the mobile client loses its connection
    message_id = seen[0]["data"]["message_id"]
    with http.stream("GET", f"/api/v1/messages/{message_id}/events?last_event_id=5") as response:
        rest = [f for f in parse_sse(response.iter_lines()) if "comment" not in f]
    ids = [int(f["id"]) for f in seen + rest]
    assert ids == list(range(1, len(ids) + 1))  # no gap, no duplicate
    assert rest[-1]["event"] == "done"


def test_conversation_history_and_message_listing(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    conversation = conversation_for(http, title="t")
    ask_stream(http, conversation, content="First question", top_k=0)
    ask_stream(http, conversation, content="Second question", top_k=0)
    roles = [m["role"] for m in upstream.requests[1]["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert upstream.requests[1]["messages"][1]["content"] == "First question"
    detail = http.get(f"/api/v1/conversations/{conversation}").json()
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant"] * 2
    assert detail["messages"][1]["usage"]["completion_tokens"] == 3
    assert detail["messages"][1]["usage"]["queue_ms"] == 0  # a slot was free at once


def test_tokenize_counts_with_the_served_tokenizer(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    response = http.post("/api/v1/tokenize", json={"text": "Hello, world!"})
    assert response.json() == {"model": "small", "tokens": 4}


def test_history_is_the_recent_turns_starting_with_a_question(team: Any) -> None:
    from apps.accounts.models import Team
    from apps.chat.models import Conversation
    from apps.chat.selectors import conversation_history
    from apps.chat.services.prepare import HISTORY_MESSAGES
    from apps.core.exceptions import NotFound

    conversation = Conversation.objects.create(team=team, title="t", collection_ids=[3, 5])
    found, history = conversation_history(
        team=team, conversation_id=conversation.pk, limit=HISTORY_MESSAGES
    )
    assert (found.pk, found.collection_ids, found.title, history) == (
        conversation.pk,
        [3, 5],
        "t",
        [],
    )
    for i in range(HISTORY_MESSAGES):  # 80 messages, one abandoned answer among them
        Message.objects.create(conversation=conversation, team=team, role="user", content=f"q{i}")
        Message.objects.create(
            conversation=conversation,
            team=team,
            role="assistant",
            content=f"a{i}" if i != 30 else "",
            status="complete" if i != 30 else "failed",
        )
    Message.objects.create(  # an answer still streaming is not history yet
        conversation=conversation, team=team, role="assistant", content="…", status="streaming"
    )
    _, history = conversation_history(
        team=team, conversation_id=conversation.pk, limit=HISTORY_MESSAGES
    )
    assert len(history) <= HISTORY_MESSAGES and history[0]["role"] == "user"
    assert history[-1] == {"role": "assistant", "content": f"a{HISTORY_MESSAGES - 1}"}
    assert {"role": "assistant", "content": ""} not in history
    assert history[-2] == {"role": "user", "content": f"q{HISTORY_MESSAGES - 1}"}
    other = Team.objects.create(name="other")
    with pytest.raises(NotFound):
        conversation_history(team=other, conversation_id=conversation.pk, limit=HISTORY_MESSAGES)


def test_a_failing_event_journal_never_fails_the_answer(
    upstream: FakeUpstream, http: httpx.Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal serves replay only: Redis or the database refusing it (busy, down)
    leaves the answer, its usage and its ledger row whole."""
    from django.db import DatabaseError

    from apps.chat.event_store import DatabaseEventStore

    attempts: list[int] = []

    async def refuse(self: Any, batches: dict[int, list[Any]]) -> None:
        attempts.append(sum(len(events) for events in batches.values()))
        raise DatabaseError("the journal is down")

    settings.STREAM_BUFFER_REDIS_URL = ""
    monkeypatch.setattr(DatabaseEventStore, "append_many", refuse)  # append goes through it
    upstream.script.tokens = [f" w{i}" for i in range(8)]
    upstream.script.delay = 0.1  # several flushes, each refused
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    assert [f["event"] for f in frames][-2:] == ["usage", "done"]
    assert not [f for f in frames if f["event"] == "error"]
    assert len(attempts) >= 2 and attempts[-1] > attempts[0]  # kept, and tried again
    message = Message.objects.get(role="assistant")
    assert (message.status, message.content) == ("complete", "".join(upstream.script.tokens))
    assert UsageRecord.objects.get(kind="chat").status == "ok"


@pytest.mark.django_db
def test_a_write_for_many_answers_goes_in_slices_and_loses_none(settings: Any) -> None:
    """Hundreds of answers' events at once (a quarter second of a thousand streams): every
    one stored under its message, readable in order, over several pipelines."""
    import asyncio

    from apps.chat.event_store import PIPELINE_SLICE, RedisEventStore

    url = redis_url()
    count = PIPELINE_SLICE * 2 + 50
    batches = {
        m: [(1, "delta", {"text": f"m{m}"}), (2, "delta", {"text": "!"})]
        for m in range(1, count + 1)
    }

    async def write_then_read() -> list[Any]:
        store = RedisEventStore(url, ttl=60)
        await store.append_many(batches)
        await store.append_many({7: [(3, "done", {"message_id": 7})]})
        return [await store.after(m, 0) for m in (1, 7, count)]

    first, seventh, last = asyncio.run(write_then_read())
    assert first == [(1, "delta", {"text": "m1"}), (2, "delta", {"text": "!"})]
    assert [e[2] for e in seventh] == [{"text": "m7"}, {"text": "!"}, {"message_id": 7}]
    assert last[0] == (1, "delta", {"text": f"m{count}"})
