"""Deleting a conversation while its answer runs: the answer stops and is billed, nothing of
it is written after the delete, and no other team's answer loses a write."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from apps.accounts.models import Team
from apps.accounts.services import api_key_create
from apps.chat.models import Conversation, Message, MessageEvent
from apps.usage.models import Reservation, UsageRecord
from tests.apps.chat.conftest import answer_frames, ask_stream, conversation_for
from tests.apps.chat.test_answers import redis_url
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def other_http(asgi_server: str, other_team: Team) -> Iterator[httpx.Client]:
    secret = api_key_create(team=other_team, name="other").secret
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=asgi_server, headers=headers, timeout=30) as client:
        yield client


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("buffer", ["database", "redis"])
def test_delete_mid_answer_stops_and_bills_it_and_leaves_other_teams_whole(
    upstream: FakeUpstream,
    http: httpx.Client,
    other_http: httpx.Client,
    settings: Any,
    buffer: str,
) -> None:
    settings.STREAM_BUFFER_REDIS_URL = redis_url() if buffer == "redis" else ""
    upstream.script.tokens = [f" w{i}" for i in range(60)]
    upstream.script.delay = 0.02
    doomed, kept = conversation_for(http), conversation_for(other_http)
    others: list[list[dict[str, Any]]] = []
    other = threading.Thread(
        target=lambda: others.append(ask_stream(other_http, kept, content="Hi", top_k=0))
    )
    seen: list[dict[str, Any]] = []
    with answer_frames(http, doomed, content="Hi", top_k=0, stream=True) as frames:
        for frame in frames:
            if "comment" in frame:
                continue
            seen.append(frame)
            if frame["event"] == "delta" and not other.is_alive() and not others:
                other.start()
                wait_for(
                    lambda: Message.objects.filter(conversation_id=kept).exists(),
                    "the other team's answer never started",
                )
                assert http.delete(f"/api/v1/conversations/{doomed}").status_code == 204
    other.join(timeout=30)
    message_id = seen[0]["data"]["message_id"]

    # The deleted conversation's answer stopped at once, said so, and was billed.
    assert [f["event"] for f in seen][-2:] == ["usage", "done"]
    assert seen[-1]["data"]["finish_reason"] == "cancelled"
    billed = UsageRecord.objects.get(object_id=str(message_id))
    assert billed.status == UsageRecord.Status.CANCELLED
    assert 1 <= billed.completion_tokens < 60
    assert billed.completion_tokens == seen[-2]["data"]["completion_tokens"]
    assert not Reservation.objects.filter(settled_at__isnull=True).exists()
    # Nothing of it is left, nor written after the delete.
    time.sleep(0.6)  # past the journal's next flush
    assert not Conversation.objects.filter(pk=doomed).exists()
    assert not Message.objects.filter(pk=message_id).exists()
    assert not MessageEvent.objects.filter(message_id=message_id).exists()
    if buffer == "redis":
        import redis

        from apps.chat.event_store import event_buffer_key

        client = redis.Redis.from_url(settings.STREAM_BUFFER_REDIS_URL)
        try:
            assert not client.exists(event_buffer_key(message_id))
        finally:
            client.close()
    # The other team's answer, streaming all along, lost nothing.
    frames = others[0]
    assert frames[-1]["event"] == "done" and frames[-1]["data"]["finish_reason"] == "stop"
    other_id = frames[0]["data"]["message_id"]
    answer = Message.objects.get(pk=other_id)
    assert answer.status == Message.Status.COMPLETE
    assert answer.content == "".join(f" w{i}" for i in range(60))
    assert UsageRecord.objects.get(object_id=str(other_id)).status == UsageRecord.Status.OK
    with other_http.stream("GET", f"/api/v1/messages/{other_id}/events") as response:
        assert response.status_code == 200
        replayed = [line for line in response.iter_lines() if line.startswith("event:")]
    assert replayed[-1] == "event: done"


def test_an_answer_whose_conversation_is_deleted_before_its_rows_stops_and_is_billed(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    """The delete finds no message to stop (the answer has written nothing yet, as when it
    waits in the tier's queue); when the answer comes to write its rows, it finds the
    conversation gone: it writes none, stops, and its usage is billed all the same."""
    from apps.chat.services import run

    upstream.script.tokens = [f" w{i}" for i in range(60)]
    upstream.script.delay = 0.02
    # The tier holds its first token until the delete is done, and the rows wait for that
    # token: the order is the test's, however busy the machine.
    deleted = threading.Event()

    def hold(body: dict[str, Any]) -> None:
        deleted.wait(timeout=30)

    upstream.on_request = hold
    conversation = conversation_for(http)
    original = run.ROWS_AFTER_SECONDS
    run.ROWS_AFTER_SECONDS = 60
    try:
        with answer_frames(http, conversation, content="Hi", top_k=0, stream=True) as frames:
            seen = [f for f in frames if "comment" not in f and not seen_delete(f, http, deleted)]
    finally:
        run.ROWS_AFTER_SECONDS = original
    message_id = seen[0]["data"]["message_id"]
    assert seen[-1]["event"] == "done"
    assert seen[-1]["data"]["finish_reason"] == "cancelled"
    billed = UsageRecord.objects.get(object_id=str(message_id))
    assert billed.status == UsageRecord.Status.CANCELLED
    assert billed.prompt_tokens > 0
    assert not Conversation.objects.filter(pk=conversation).exists()
    assert not Message.objects.exists()
    assert not MessageEvent.objects.exists()
    assert not Reservation.objects.filter(settled_at__isnull=True).exists()


def seen_delete(frame: dict[str, Any], http: httpx.Client, deleted: threading.Event) -> bool:
    """On the answer's first event, delete its conversation (its rows not yet written),
    then let the tier go on."""
    if frame.get("event") == "message":
        conversation = frame["data"]["conversation_id"]
        assert not Message.objects.filter(conversation_id=conversation).exists()
        assert http.delete(f"/api/v1/conversations/{conversation}").status_code == 204
        deleted.set()
    return False


@pytest.mark.integration
def test_delete_during_a_real_llama_cpp_stream(
    llama_server: str,
    http: httpx.Client,
    other_http: httpx.Client,
    settings: Any,
) -> None:
    """SmolLM2 served by llama.cpp: the conversation deleted mid-answer, the answer stops
    and is billed what it generated, and the next team's answer is served whole."""
    settings.INFERENCE_BASE_URL = llama_server
    settings.MODEL_ALIASES = {"small": {**settings.MODEL_ALIASES["small"], "context_window": 2048}}
    doomed, kept = conversation_for(http), conversation_for(other_http)
    question = "Write a long story about a lighthouse keeper and the sea."
    seen: list[dict[str, Any]] = []
    with answer_frames(
        http, doomed, content=question, top_k=0, max_tokens=400, stream=True
    ) as frames:
        deltas = 0
        for frame in frames:
            if "comment" in frame:
                continue
            seen.append(frame)
            deltas += frame["event"] == "delta"
            if deltas == 3 and frame["event"] == "delta":
                assert http.delete(f"/api/v1/conversations/{doomed}").status_code == 204
    message_id = seen[0]["data"]["message_id"]
    assert seen[-1]["event"] == "done"
    assert seen[-1]["data"]["finish_reason"] == "cancelled"
    usage = seen[-2]["data"]
    billed = UsageRecord.objects.get(object_id=str(message_id))
    assert billed.status == UsageRecord.Status.CANCELLED
    assert (billed.prompt_tokens, billed.completion_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert 3 <= billed.completion_tokens < 400
    assert not Message.objects.filter(conversation_id=doomed).exists()
    assert not MessageEvent.objects.filter(message_id=message_id).exists()
    frames_b = ask_stream(other_http, kept, content="Say hello.", top_k=0, max_tokens=16)
    assert frames_b[-1]["event"] == "done"
    assert frames_b[-1]["data"]["finish_reason"] in {"stop", "length"}
    answer = Message.objects.get(pk=frames_b[0]["data"]["message_id"])
    assert answer.status == Message.Status.COMPLETE and answer.content


@pytest.mark.parametrize("how", ["delete", "cancel"])
def test_a_stop_while_the_tier_prefills_ends_the_answer_at_once(
    upstream: FakeUpstream, http: httpx.Client, how: str
) -> None:
    """No token has come (the tier prefills a long prompt, or stalls): a delete or a cancel
    still stops the answer then, not at the next token or the first-token timeout. It is
    billed its prompt, and the tier's request is closed."""
    upstream.script.stall_after = 0  # no token comes
    conversation = conversation_for(http)
    seen: list[dict[str, Any]] = []
    with answer_frames(http, conversation, content="Hi", top_k=0, stream=True) as frames:
        for frame in frames:
            if "comment" in frame:
                continue
            seen.append(frame)
            if frame["event"] == "retrieval":
                message_id = seen[0]["data"]["message_id"]
                wait_for(Message.objects.filter(pk=message_id).exists, "no rows")
                if how == "delete":
                    response = http.delete(f"/api/v1/conversations/{conversation}")
                    assert response.status_code == 204
                else:
                    response = http.post(f"/api/v1/messages/{message_id}/cancel")
                    assert response.status_code == 202
    assert [f["event"] for f in seen] == ["message", "retrieval", "usage", "done"]
    assert seen[-1]["data"]["finish_reason"] == "cancelled"
    billed = UsageRecord.objects.get(object_id=str(message_id))
    assert billed.status == UsageRecord.Status.CANCELLED
    assert (billed.prompt_tokens > 0, billed.completion_tokens) == (True, 0)
    wait_for(lambda: bool(upstream.disconnected_at), "the tier's request was not closed")
    assert Message.objects.filter(pk=message_id).exists() == (how == "cancel")
