"""Context compaction (``HISTORY_POLICY=summarize``) and the tokens left out
(``dropped_tokens``), through the app on a socket in front of the fake tier.

The conversation: four long questions (about 125 tokens each with the fake tokenizer)
asked in a roomy window, then a window of 420 tokens with 20 kept for the answer, which
holds two of those exchanges: the two oldest are dropped, or summarised.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.db import connection

from apps.accounts.models import Team
from apps.chat.models import Conversation, ConversationSummary, Message
from apps.chat.services.summary_store import (
    marks_of,
    summary_claim,
    summary_complete,
    summary_find,
)
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord
from apps.usage.values import nanos_of
from inference import FakeTokenizer
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

SUMMARY_TEXT = ["Pantry", " key", " notes", "."]


def _long_conversation(http: httpx.Client, upstream: FakeUpstream, settings: Any) -> int:
    upstream.script.tokens = SUMMARY_TEXT
    conversation = conversation_for(http)
    for turn in range(4):
        ask_stream(http, conversation, content=f"Earlier question {turn} " + "pad " * 120, top_k=0)
    settings.MODEL_ALIASES = {
        "small": {**settings.MODEL_ALIASES["small"], "context_window": 420, "max_output_tokens": 20}
    }
    settings.SUMMARY_MAX_TOKENS = 16
    return conversation


def _usage(frames: list[dict[str, Any]]) -> dict[str, Any]:
    assert [f["event"] for f in frames][-2:] == ["usage", "done"], frames
    return dict(next(f["data"] for f in frames if f["event"] == "usage"))


def _summary_requests(upstream: FakeUpstream) -> list[dict[str, Any]]:
    return [
        body
        for body in upstream.requests
        if body["messages"][-1]["content"].startswith("Summarise the conversation above")
    ]


def _history(conversation: int) -> list[str]:
    return list(
        Message.objects.filter(conversation_id=conversation)
        .order_by("created_at", "pk")
        .values_list("content", flat=True)
    )


def test_drop_reports_the_exact_tokens_the_turns_left_out_would_have_taken(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    conversation = _long_conversation(http, upstream, settings)
    before = _history(conversation)
    usage = _usage(ask_stream(http, conversation, content="Where is the key?", top_k=0))
    assert usage["dropped_turns"] == 4 and usage["summarized_turns"] == 0
    count = FakeTokenizer().count
    expected = sum(count(text) for text in before[: usage["dropped_turns"]])
    assert usage["dropped_tokens"] == expected > 0
    row = UsageRecord.objects.filter(operation="answer").order_by("pk").last()
    assert row is not None and row.dropped_tokens == expected
    assert not _summary_requests(upstream) and not ConversationSummary.objects.exists()


def test_a_summary_replaces_the_oldest_turns_and_is_charged_under_the_tag(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    before = _history(conversation)
    usage = _usage(ask_stream(http, conversation, content="Where is the key?", top_k=0, tag="ops"))
    summarised = usage["summarized_turns"]
    assert summarised == 6 and usage["dropped_turns"] == 0
    count = FakeTokenizer().count
    assert usage["dropped_tokens"] == sum(count(text) for text in before[:summarised])
    (asked,) = _summary_requests(upstream)
    assert asked["max_tokens"] == 16 and asked["model"] == "SmolLM2-135M-Instruct"
    answer = upstream.requests[-1]
    assert "<summary>\nPantry key notes.\n</summary>" in answer["messages"][0]["content"]
    assert len(answer["messages"]) == 1 + 2 + 1  # system, one exchange, the question
    row = UsageRecord.objects.get(operation="summary")
    assert (row.kind, row.model, row.tag, row.team_id) == ("chat", "small", "ops", team.pk)
    tokenizer = FakeTokenizer()
    assert row.prompt_tokens == tokenizer.count_chat(asked["messages"])
    assert row.completion_tokens == tokenizer.count("Pantry key notes.")
    assert row.cost_usd > 0
    assert row.object_id == f"conversation:{conversation}"


def test_the_summary_is_reused_until_a_turn_it_covers_changes(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    ask_stream(http, conversation, content="Where is the key?", top_k=0)
    usage = _usage(ask_stream(http, conversation, content="And the door?", top_k=0))
    assert usage["summarized_turns"] == 6  # the same summary: no new call, no new row
    assert len(_summary_requests(upstream)) == 1
    assert UsageRecord.objects.filter(operation="summary").count() == 1
    first = Message.objects.filter(conversation_id=conversation).order_by("created_at", "pk")[0]
    Message.objects.filter(pk=first.pk).update(content="Earlier question 0, edited " + "x " * 120)
    ask_stream(http, conversation, content="And the window?", top_k=0)
    assert len(_summary_requests(upstream)) == 2
    assert UsageRecord.objects.filter(operation="summary").count() == 2
    assert ConversationSummary.objects.filter(completed_at__isnull=False).count() == 1


def test_the_summary_is_encrypted_at_rest(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    ask_stream(http, conversation, content="Where is the key?", top_k=0)
    summary = ConversationSummary.objects.get()
    assert summary.text == "Pantry key notes." and summary.team_id == team.pk
    table = ConversationSummary._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT text, covers, marks FROM {table}")  # noqa: S608 - a model's table
        ((raw, covers, marks),) = cursor.fetchall()
    assert "Pantry" not in raw and raw != summary.text
    assert "Earlier" not in covers + str(marks) and len(covers) == 64


def test_another_teams_conversation_with_the_same_turns_gets_no_summary(
    upstream: FakeUpstream, http: httpx.Client, team: Team, other_team: Team, settings: Any
) -> None:
    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    ask_stream(http, conversation, content="Where is the key?", top_k=0)
    ours = Conversation.objects.get(pk=conversation)
    theirs = Conversation.objects.create(team=other_team)
    history = [
        {"role": m.role, "content": m.content}
        for m in Message.objects.filter(conversation=ours).order_by("created_at", "pk")
    ]
    assert summary_find(conversation=ours, history=history) is not None
    assert summary_find(conversation=theirs, history=history) is None
    theirs_marks = marks_of(conversation=theirs, turns=history[:6])
    assert not set(theirs_marks) & set(marks_of(conversation=ours, turns=history[:6]))
    # Nor a row naming our conversation under their team.
    forged = Conversation.objects.filter(pk=ours.pk)
    forged_ours = forged.get()
    forged_ours.team_id = other_team.pk
    assert summary_find(conversation=forged_ours, history=history) is None


def test_one_claim_per_turns_and_a_conversation_deleted_mid_summary_leaves_nothing(
    team: Team,
) -> None:
    conversation = Conversation.objects.create(team=team)
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    claim = summary_claim(conversation=conversation, turns=turns)
    assert claim is not None
    assert summary_claim(conversation=conversation, turns=turns) is None  # one build at a time
    conversation.delete()
    assert not summary_complete(claim=claim, text="secret summary", tokens=2)
    assert not ConversationSummary.objects.exists()


def test_a_summary_refused_by_a_limit_fails_the_answer_with_429_and_leaves_no_claim(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    Limit.objects.create(team=team, daily_tokens=100)  # the summary's prompt is about 300
    response = http.post(
        f"/api/v1/conversations/{conversation}/messages",
        json={"content": "Where is the key?", "top_k": 0},
    )
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "team_quota_exceeded"
    assert not _summary_requests(upstream)
    assert not ConversationSummary.objects.exists()
    assert not UsageRecord.objects.filter(operation="summary").exists()


def test_a_summary_is_held_and_charged_against_a_money_budget_and_a_tags(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    Limit.objects.create(team=team, daily_usd=Decimal("1"))
    Limit.objects.create(team=team, tag="ops", daily_usd=Decimal("1"))
    usage = _usage(ask_stream(http, conversation, content="Where is the key?", top_k=0, tag="ops"))
    assert usage["summarized_turns"] == 6
    row = UsageRecord.objects.get(operation="summary")
    # Two holds (the turns before had no limits): the summary's, and the answer's.
    summary = Reservation.objects.get(team=team, actual_tokens=row.total_tokens)
    answer = Reservation.objects.exclude(pk=summary.pk).get(team=team)
    assert summary.actual_tokens == row.total_tokens
    assert summary.actual_cost_nanos == nanos_of(row.cost_usd) <= summary.cost_nanos
    assert len(summary.cost_counters) == len(answer.cost_counters) == 2  # the team's, the tag's
    spent = sum(nanos_of(r.cost_usd) for r in UsageRecord.objects.filter(team=team, tag="ops"))
    for counter in QuotaCounter.objects.filter(limit__team=team, limit__tag="ops", unit="usd"):
        assert counter.used == spent


def test_a_summary_goes_with_the_turns_retention_purges(team: Team) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from apps.chat.services.retention import conversations_purge

    conversation = Conversation.objects.create(team=team)
    Message.objects.create(conversation=conversation, team=team, role="user", content="old")
    turns = [{"role": "user", "content": "old"}]
    claim = summary_claim(conversation=conversation, turns=turns)
    assert claim is not None and summary_complete(claim=claim, text="what old said", tokens=3)
    later = timezone.now() + timedelta(hours=1)  # the conversation itself stays
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=later)
    conversations_purge(team=team, older_than=timezone.now() + timedelta(seconds=1))
    assert Conversation.objects.filter(pk=conversation.pk).exists()
    assert not ConversationSummary.objects.exists()


def test_two_answers_at_once_in_one_conversation_pay_for_one_summary(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    import threading

    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    upstream.script.delay = 0.4  # the first summary is still being written when the second asks
    results: dict[str, dict[str, Any]] = {}

    def answer(name: str) -> None:
        with httpx.Client(base_url=http.base_url, headers=http.headers, timeout=30) as client:
            results[name] = _usage(ask_stream(client, conversation, content=name, top_k=0))

    first = threading.Thread(target=answer, args=("First question?",))
    first.start()
    for _ in range(500):  # at most 10 s
        if _summary_requests(upstream) or not first.is_alive():
            break
        first.join(0.02)
    answer("Second question?")
    first.join()
    assert len(_summary_requests(upstream)) == 1
    assert UsageRecord.objects.filter(operation="summary").count() == 1
    assert results["First question?"]["summarized_turns"] == 6
    second = results["Second question?"]
    assert (second["summarized_turns"], second["dropped_turns"]) == (0, 4)  # dropped, unpaid
    assert ConversationSummary.objects.get().completed_at is not None


def test_an_estimate_uses_the_cached_summary_as_the_answer_then_does(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    ask_stream(http, conversation, content="Where is the key?", top_k=0)
    body = {"content": "And the door?", "top_k": 0}
    estimate = http.post("/api/v1/estimate", json={**body, "conversation": conversation})
    assert estimate.status_code == 200, estimate.text
    guess = estimate.json()
    usage = _usage(ask_stream(http, conversation, **body))
    assert guess["summarized_turns"] == usage["summarized_turns"] == 6
    assert guess["prompt_tokens"] == usage["prompt_tokens"]
    assert guess["dropped_tokens"] == usage["dropped_tokens"] > 0
    assert len(_summary_requests(upstream)) == 1  # the estimate built none


def test_the_summary_is_reused_once_its_oldest_turns_leave_the_history_read(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any, monkeypatch: Any
) -> None:
    from apps.chat.services import prepare

    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    monkeypatch.setattr(prepare, "HISTORY_MESSAGES", 8)  # the 8 messages there are now
    assert _usage(ask_stream(http, conversation, content="Where?", top_k=0))["summarized_turns"]
    # 10 messages now: the two oldest, summarised, are no longer read; four still are.
    usage = _usage(ask_stream(http, conversation, content="And the door?", top_k=0))
    assert usage["summarized_turns"] == 4 and usage["dropped_turns"] == 0
    assert len(_summary_requests(upstream)) == 1


def test_a_deleted_covered_turn_is_no_slide_of_the_history_read(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    ask_stream(http, conversation, content="Where is the key?", top_k=0)
    oldest = Message.objects.filter(conversation_id=conversation).order_by("created_at", "pk")
    Message.objects.filter(pk__in=[m.pk for m in oldest[:2]]).delete()  # the first exchange
    ask_stream(http, conversation, content="And the door?", top_k=0)
    assert len(_summary_requests(upstream)) == 2  # what it said of them is not reused


def test_a_question_that_leaves_the_summary_no_room_is_answered_with_the_history_dropped(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    from inference import SYSTEM_PROMPT

    conversation = _long_conversation(http, upstream, settings)
    settings.HISTORY_POLICY = "summarize"
    ask_stream(http, conversation, content="Where is the key?", top_k=0)
    empty = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": ""}]
    words = 400 - FakeTokenizer().count_chat(empty) - 5  # fits alone, not with a summary
    frames = ask_stream(http, conversation, content="word " * words, top_k=0)
    usage = _usage(frames)
    assert "error" not in [f["event"] for f in frames]
    assert usage["summarized_turns"] == 0 and usage["dropped_turns"] == 10
    assert usage["prompt_tokens"] == 400 - 5
    assert len(_summary_requests(upstream)) == 1  # none made that could not fit
