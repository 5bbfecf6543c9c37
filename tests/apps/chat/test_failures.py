"""Failures that are not the tier's: every stream still ends with ``usage`` and ``done``,
every answer is settled once, and nothing stays ``streaming`` for ever."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import OperationalError
from django.utils import timezone

from apps.chat.models import Conversation, Message
from apps.chat.services import generate as answer_generate
from apps.chat.services import run as answer_run
from apps.chat.services.sweep import answer_longest_seconds, messages_close_abandoned
from apps.usage.models import UsageRecord
from tests.apps.chat.conftest import ask_stream, conversation_for, parse_sse
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_failure_mid_stream_ends_in_band_with_usage_and_done(
    upstream: FakeUpstream, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.script.tokens = [" one", " two", " three", " four"]
    upstream.script.delay = 0.02  # apart: one delta (and one tick) each
    ticks = 0
    original = answer_generate._tick

    def failing_tick(run: Any, now: float) -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 3:
            raise RuntimeError("a bug, or a dependency gone")
        original(run, now)

    monkeypatch.setattr(answer_generate, "_tick", failing_tick)
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    names = [f["event"] for f in frames]
    assert names[-3:] == ["error", "usage", "done"]
    assert frames[-3]["data"]["code"] == "internal_error"
    assert frames[-1]["data"]["finish_reason"] == "error"
    message = Message.objects.get(pk=frames[0]["data"]["message_id"])
    assert message.status == Message.Status.FAILED
    record = UsageRecord.objects.get(kind="chat")
    assert record.error_code == "internal_error"
    assert record.total_tokens == frames[-2]["data"]["total_tokens"]


def test_a_database_down_at_settlement_still_ends_the_stream_and_settles_later(
    upstream: FakeUpstream, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    original = answer_run.settlement_write

    def flaky_write(*args: Any, rows_written: bool) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OperationalError("server closed the connection unexpectedly")
        original(*args, rows_written=rows_written)

    monkeypatch.setattr(answer_run, "settlement_write", flaky_write)
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    assert [f["event"] for f in frames][-2:] == ["usage", "done"]
    message_id = frames[0]["data"]["message_id"]
    deadline = timezone.now() + timedelta(seconds=15)
    while not UsageRecord.objects.filter(object_id=str(message_id)).exists():
        assert timezone.now() < deadline, "never settled"
    assert calls == 2
    assert Message.objects.get(pk=message_id).status == Message.Status.COMPLETE


def test_the_database_down_before_the_first_byte_is_a_503(
    upstream: FakeUpstream, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(**kwargs: Any) -> None:
        raise OperationalError("could not connect to server")

    conversation = conversation_for(http)
    monkeypatch.setattr("apps.chat.services.run.answer_prepare", down)
    response = http.post(
        f"/api/v1/conversations/{conversation}/messages",
        json={"content": "Hi", "top_k": 0, "stream": True},
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "database_unavailable"
    assert int(response.headers["Retry-After"]) >= 1


def stuck_answer(*, age_seconds: float, **fields: Any) -> Message:
    """An assistant message as a process that died mid-answer leaves it."""
    conversation = Conversation.objects.create(team=fields.pop("team"))
    message = Message.objects.create(
        conversation=conversation,
        team=conversation.team,
        role=Message.Role.ASSISTANT,
        status=fields.pop("status", Message.Status.STREAMING),
        **fields,
    )
    created = timezone.now() - timedelta(seconds=age_seconds)
    Message.objects.filter(pk=message.pk).update(created_at=created)
    return message


def test_the_sweep_closes_only_answers_older_than_any_answer_can_be(team: Any) -> None:
    longest = answer_longest_seconds()
    old = stuck_answer(team=team, age_seconds=longest + 5)
    young = stuck_answer(team=team, age_seconds=longest - 60)
    assert messages_close_abandoned() == 1
    old.refresh_from_db()
    young.refresh_from_db()
    assert old.status == Message.Status.FAILED
    assert old.error is not None and old.error["code"] == "answer_abandoned"
    assert young.status == Message.Status.STREAMING


def replay(http: httpx.Client, message_id: int) -> list[dict[str, Any]]:
    with http.stream("GET", f"/api/v1/messages/{message_id}/events") as response:
        assert response.status_code == 200
        return [f for f in parse_sse(response.iter_lines()) if "comment" not in f]


def test_a_replay_of_an_abandoned_answer_ends_at_once(http: httpx.Client, team: Any) -> None:
    message = stuck_answer(team=team, age_seconds=answer_longest_seconds() + 5)
    frames = replay(http, message.pk)
    assert [f["event"] for f in frames] == ["error", "done"]
    assert frames[0]["data"]["code"] == "answer_abandoned"
    assert frames[1]["data"] == {"message_id": message.pk, "finish_reason": "error"}


def test_a_replay_of_an_answer_whose_ending_was_not_journalled(
    http: httpx.Client, team: Any
) -> None:
    error = {"type": "upstream_error", "code": "inference_timeout", "message": "…", "param": None}
    message = stuck_answer(
        team=team, age_seconds=1, status=Message.Status.FAILED, error=error, finish_reason="error"
    )
    frames = replay(http, message.pk)
    assert [f["event"] for f in frames] == ["error", "done"]
    assert frames[0]["data"] == error
