"""Replay (``GET …/events``): pushed by the event store's writes, not polled, reading only
what is new; and a per-team cap on open replays that another team never feels."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from apps.accounts.models import Team
from apps.accounts.services import api_key_create
from apps.chat import event_store as event_module
from apps.chat.event_store import database as database_store
from apps.chat.event_store import redis as redis_store
from apps.chat.models import Conversation, Message
from tests.apps.chat.conftest import answer_frames, ask_stream, conversation_for, parse_sse
from tests.apps.chat.test_answers import redis_url
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def watching() -> int:
    """Watches left open in this process (none once every replay ended)."""
    from apps.chat.feed import event_feed

    return event_feed.watching()


def replay(http: httpx.Client, message_id: int, after: int = 0) -> list[dict[str, Any]]:
    url = f"/api/v1/messages/{message_id}/events?last_event_id={after}"
    with http.stream("GET", url) as response:
        assert response.status_code == 200, response.read()
        return [f for f in parse_sse(response.iter_lines()) if "comment" not in f]


@contextlib.contextmanager
def counted_store(monkeypatch: pytest.MonkeyPatch, buffer: str) -> Iterator[dict[str, Any]]:
    """Counts the store's reads (each expands what it fetched: ``events_after``), the
    records a read fetched from Redis (each decrypted: ``_open``) and the writes naming each
    message."""
    store = event_module.RedisEventStore if buffer == "redis" else event_module.DatabaseEventStore
    module = redis_store if buffer == "redis" else database_store
    counts: dict[str, Any] = {"reads": 0, "opened": 0, "writes": {}}
    expand, open_record, append_many = module.events_after, redis_store._open, store.append_many

    def counted_after(*args: Any) -> Any:
        counts["reads"] += 1
        return expand(*args)

    def counted_open(item: bytes) -> Any:
        counts["opened"] += 1
        return open_record(item)

    async def counted_append_many(self: Any, batches: dict[int, Any]) -> None:
        await append_many(self, batches)
        for message_id in batches:
            counts["writes"][message_id] = counts["writes"].get(message_id, 0) + 1

    monkeypatch.setattr(module, "events_after", counted_after)
    monkeypatch.setattr(redis_store, "_open", counted_open)
    monkeypatch.setattr(store, "append_many", counted_append_many)
    yield counts


@contextlib.contextmanager
def running_answer(http: httpx.Client) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """A question asked in a thread: its message id once its rows are there, and the
    frames its own stream got (complete when the block ends)."""
    conversation = conversation_for(http)
    started: queue.Queue[int] = queue.Queue()
    answered: list[dict[str, Any]] = []

    def ask() -> None:
        with answer_frames(http, conversation, content="Hi", top_k=0, stream=True) as frames:
            for frame in frames:
                if "comment" not in frame:
                    if not answered:
                        started.put(frame["data"]["message_id"])
                    answered.append(frame)

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        message_id = started.get(timeout=10)
        deadline = time.monotonic() + 10
        while not Message.objects.filter(pk=message_id).exists():  # written while it prefills
            assert time.monotonic() < deadline, "no message row"
            time.sleep(0.01)
        yield message_id, answered
    finally:
        asker.join(timeout=30)


@pytest.mark.parametrize("buffer", ["database", "redis"])
def test_a_replay_of_a_running_answer_reads_the_store_only_when_woken(
    upstream: FakeUpstream,
    http: httpx.Client,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    buffer: str,
) -> None:
    """The database with the in-process wake-up, Redis with pub/sub: the replay follows
    the answer live, reading once at the start and then once per write of its events
    (a poll would read several times between two tokens this far apart), and with Redis
    it fetches and decrypts each stored record once, not the whole list every time."""
    settings.STREAM_BUFFER_REDIS_URL = redis_url() if buffer == "redis" else ""
    settings.REPLAY_RECHECK_SECONDS = 60  # the fallback look never comes within the test
    upstream.script.tokens = [" one", " two", " three", " four"]
    upstream.script.delay = 0.6
    with counted_store(monkeypatch, buffer) as counts, running_answer(http) as started:
        message_id, answered = started
        replayed = replay(http, message_id)
    assert [(f["id"], f["event"], f["data"]) for f in replayed] == [
        (f["id"], f["event"], f["data"]) for f in answered
    ]
    assert replayed[-1]["event"] == "done" and len(replayed) >= 6
    writes = counts["writes"][message_id]
    assert writes >= 4  # the tokens were stored one write each: the replay followed live
    # The first read, one when the subscription starts (Redis), then one per write.
    assert counts["reads"] <= writes + 2
    if buffer == "redis":
        import redis

        client = redis.Redis.from_url(settings.STREAM_BUFFER_REDIS_URL)
        try:
            records = client.llen(event_module.event_buffer_key(message_id))
        finally:
            client.close()
        assert counts["opened"] == records
    assert watching() == 0


def test_replays_in_one_process_share_one_subscription(
    upstream: FakeUpstream, http: httpx.Client, settings: Any
) -> None:
    """Three replays of one answer follow it live on one pub/sub connection of this
    process, not one each."""
    import redis

    from apps.chat.feed import feed_channel

    url = settings.STREAM_BUFFER_REDIS_URL = redis_url()
    settings.REPLAY_RECHECK_SECONDS = 60
    upstream.script.tokens = [" one", " two", " three"]
    upstream.script.delay = 0.5
    client = redis.Redis.from_url(url)
    channel = feed_channel(url)
    try:
        before = client.pubsub_numsub(channel)[0][1]
        with running_answer(http) as (message_id, answered), ThreadPoolExecutor(3) as pool:
            replays = [pool.submit(replay, http, message_id) for _ in range(3)]
            deadline = time.monotonic() + 10
            while watching() < 3:
                assert time.monotonic() < deadline, "the replays did not open"
                time.sleep(0.01)
            # The subscription is made on the feed's own thread, just after the watches
            # open: sample it while the three follow the answer.
            during = []
            while watching() >= 3 and time.monotonic() < deadline:
                during.append(client.pubsub_numsub(channel)[0][1])
                time.sleep(0.02)
            replayed = [r.result(timeout=30) for r in replays]
    finally:
        client.close()
    # One more than before (an earlier test's server may leave its own behind a while).
    assert during and max(during) >= 1 and max(during) - before <= 1
    expected = [(f["id"], f["data"]) for f in answered]
    assert all([(f["id"], f["data"]) for f in r] == expected for r in replayed)


@pytest.mark.parametrize("buffer", ["database", "redis"])
def test_the_replay_of_a_finished_answer_ends_at_once(
    upstream: FakeUpstream,
    http: httpx.Client,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    buffer: str,
) -> None:
    settings.STREAM_BUFFER_REDIS_URL = redis_url() if buffer == "redis" else ""
    settings.REPLAY_RECHECK_SECONDS = 60
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    message_id = frames[0]["data"]["message_id"]
    with counted_store(monkeypatch, buffer) as counts:
        replayed = replay(http, message_id, after=2)
    assert [(f["id"], f["data"]) for f in replayed] == [(f["id"], f["data"]) for f in frames[2:]]
    assert counts["reads"] == 1 and counts["writes"] == {}
    assert watching() == 0


def streaming_message(team: Team) -> Message:
    """An answer still streaming that stores nothing more: its replays stay open."""
    conversation = Conversation.objects.create(team=team, title="open")
    return Message.objects.create(
        conversation=conversation,
        team=team,
        role=Message.Role.ASSISTANT,
        status=Message.Status.STREAMING,
    )


def open_replay(client: httpx.Client, message_id: int) -> httpx.Response:
    request = client.build_request("GET", f"/api/v1/messages/{message_id}/events")
    return client.send(request, stream=True)


def test_replays_past_the_teams_cap_get_429_while_another_team_still_replays(
    limiter_store: str,
    asgi_server: str,
    http: httpx.Client,
    team: Team,
    other_team: Team,
    settings: Any,
) -> None:
    """Team A holds its cap of open replays: its next one is refused before any byte,
    team B's still opens, and a replay whose client went away gives its slot back."""
    settings.REPLAY_MAX_PER_TEAM = 2
    settings.REPLAY_RECHECK_SECONDS = 60
    running = streaming_message(team)
    finished = streaming_message(other_team)
    Message.objects.filter(pk=finished.pk).update(status=Message.Status.COMPLETE)
    other_key = api_key_create(team=other_team, name="b").secret
    open_ones: list[httpx.Response] = []
    with httpx.Client(
        base_url=asgi_server, headers={"Authorization": f"Bearer {other_key}"}, timeout=30
    ) as team_b:
        try:
            for _ in range(2):
                open_ones.append(open_replay(http, running.pk))
                assert open_ones[-1].status_code == 200
            refused = open_replay(http, running.pk)
            open_ones.append(refused)
            assert refused.status_code == 429
            refused.read()
            assert refused.json()["error"]["code"] == "too_many_concurrent_streams"
            assert refused.headers["Retry-After"] == "1"
            assert refused.headers["x-ratelimit-limit-streams"] == "2"

            replayed = replay(team_b, finished.pk)
            assert [f["event"] for f in replayed] == ["done"]
            assert replayed[0]["data"] == {"message_id": finished.pk, "finish_reason": "stop"}

            open_ones.pop().close()
            open_ones.pop().close()  # the client goes away: its slot comes back
            deadline = time.monotonic() + 10
            while True:
                again = open_replay(http, running.pk)
                if again.status_code == 200:
                    open_ones.append(again)
                    break
                again.close()
                assert time.monotonic() < deadline, "the closed replay kept its slot"
                time.sleep(0.05)
            extra = open_replay(http, running.pk)
            extra.close()
            assert extra.status_code == 429
        finally:
            for response in open_ones:
                response.close()


def test_a_replay_whose_message_is_deleted_ends_with_done(
    http: httpx.Client, team: Team, settings: Any
) -> None:
    """The conversation goes (a delete in the page) while a replay follows its answer:
    the replay ends in-band, ``done`` last, instead of breaking off."""
    settings.REPLAY_RECHECK_SECONDS = 0.05  # nothing is stored to wake it: it looks itself
    running = streaming_message(team)
    with http.stream("GET", f"/api/v1/messages/{running.pk}/events") as response:
        assert response.status_code == 200
        Conversation.objects.filter(pk=running.conversation_id).delete()
        frames = [f for f in parse_sse(response.iter_lines()) if "comment" not in f]
    assert frames == [
        {
            "id": "1",
            "event": "done",
            "data": {"message_id": running.pk, "finish_reason": "cancelled"},
        }
    ]
    assert watching() == 0


def test_a_replay_dropped_before_it_started_gives_its_slot_back(team: Team, settings: Any) -> None:
    """A client that leaves between the slot and the first byte: the response and its
    unstarted stream are dropped, and the slot with them."""
    import gc

    from apps.chat.services.replay import local_replays, replay_follow, replay_slot_take

    settings.RATE_LIMIT_REDIS_URL = ""
    settings.REPLAY_MAX_PER_TEAM = 1
    slot = replay_slot_take(team=team)
    stream = replay_follow(slot=slot, message_id=streaming_message(team).pk, after=0)
    assert local_replays.open(team.pk) == 1
    del slot, stream
    gc.collect()
    assert local_replays.open(team.pk) == 0
    replay_slot_take(team=team).release()
