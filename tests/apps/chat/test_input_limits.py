"""Cheap checks before expensive ones, on both chat surfaces: how many messages and how
long are refused from their count and length alone, before anything is tokenized; a long
question that fits is answered, one that does not gets ``context_length_exceeded``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from rest_framework.test import APIClient

from apps.chat.models import Message
from inference import ChatMessage, FakeTokenizer
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)  # the answer views read on a pool

COMPLETIONS = "/v1/chat/completions"


class RecordingTokenizer(FakeTokenizer):
    """The fake tokenizer, recording the characters of content in every prompt count."""

    calls: ClassVar[list[int]] = []

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        self.calls.append(sum(len(m["content"]) for m in messages))
        return super().count_chat(messages)


@pytest.fixture
def counts(upstream: FakeUpstream, settings: Any) -> list[int]:
    settings.TOKENIZER_BACKEND = f"{__name__}.RecordingTokenizer"
    RecordingTokenizer.calls.clear()
    return RecordingTokenizer.calls


def small_window(settings: Any, window: int, max_output_tokens: int = 50) -> None:
    small = settings.MODEL_ALIASES["small"]
    settings.MODEL_ALIASES = {
        "small": {**small, "context_window": window, "max_output_tokens": max_output_tokens}
    }


def empty_messages(count: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": ""} for _ in range(count)]


def error_of(response: Any, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.content
    error: dict[str, Any] = response.json()["error"]
    return error


def ask(api: APIClient, content: str) -> Any:
    conversation = api.post("/api/v1/conversations", {}, format="json").json()["id"]
    path = f"/api/v1/conversations/{conversation}/messages"
    return api.post(path, {"content": content, "top_k": 0}, format="json")


def test_two_thousand_messages_are_refused_before_any_count(
    api: APIClient, counts: list[int], upstream: FakeUpstream
) -> None:
    response = api.post(
        COMPLETIONS, {"model": "small", "messages": empty_messages(2_000)}, format="json"
    )
    assert error_of(response) == {
        "type": "invalid_request_error",
        "code": "too_many_messages",
        "message": "messages has 2000 messages; at most 1000 are accepted.",
        "param": "messages",
    }
    assert counts == []
    assert upstream.requests == []
    assert not Message.objects.exists()


def test_the_message_cap_is_a_setting(
    api: APIClient, counts: list[int], settings: Any, upstream: FakeUpstream
) -> None:
    settings.MAX_CHAT_MESSAGES = 3
    four = api.post(COMPLETIONS, {"model": "small", "messages": empty_messages(4)}, format="json")
    assert error_of(four)["code"] == "too_many_messages"
    assert counts == []
    three = api.post(COMPLETIONS, {"model": "small", "messages": empty_messages(3)}, format="json")
    assert three.status_code == 200, three.content
    assert len(upstream.requests) == 1


def test_a_message_longer_than_any_window_is_refused_by_length_on_both_surfaces(
    api: APIClient, counts: list[int], settings: Any, upstream: FakeUpstream
) -> None:
    too_long = "x" * (settings.MAX_MESSAGE_CHARS + 1)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": too_long}]
    error = error_of(api.post(COMPLETIONS, {"model": "small", "messages": messages}, format="json"))
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages.1.content")
    assert f"{len(too_long)} characters" in error["message"]
    error = error_of(ask(api, too_long))
    assert (error["code"], error["param"]) == ("context_length_exceeded", "content")
    assert counts == []
    assert upstream.requests == []


def test_a_long_question_that_fits_is_answered_and_one_that_does_not_is_told_why(
    api: APIClient, counts: list[int], settings: Any, upstream: FakeUpstream
) -> None:
    # 40,000 characters: past the old 32,000-character cap, 4,000 tokens to the fake.
    fits = ask(api, "abcdefghi " * 4_000)
    assert fits.status_code == 201, fits.content
    assert upstream.requests[0]["messages"][-1]["content"].startswith("abcdefghi ")
    # As many characters, 8,000 tokens: more than 8,192 less the 512 kept for the answer.
    error = error_of(ask(api, "word " * 8_000))
    assert error["code"] == "context_length_exceeded"
    assert "needs 8" in error["message"] and "8192 tokens" in error["message"]
    assert len(upstream.requests) == 1


def test_a_question_longer_than_the_models_window_can_hold_is_refused_uncounted(
    api: APIClient, counts: list[int], settings: Any, upstream: FakeUpstream
) -> None:
    small_window(settings, 200)  # room for 150 tokens: 2,400 characters at most
    error = error_of(ask(api, "x" * 3_000))
    assert error["code"] == "context_length_exceeded"
    assert "room for at most 2400 characters" in error["message"]
    messages = [{"role": "user", "content": "x" * 3_000}]
    error = error_of(api.post(COMPLETIONS, {"model": "small", "messages": messages}, format="json"))
    assert error["code"] == "context_length_exceeded"
    assert counts == []
    assert upstream.requests == []


def test_a_thousand_messages_are_fitted_in_logarithmically_many_counts(
    api: APIClient, counts: list[int], settings: Any, upstream: FakeUpstream
) -> None:
    small_window(settings, 1_050)  # room for 1,000 tokens; 1,000 messages need 3,000+
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(998)
    ]
    messages = [{"role": "system", "content": "Be brief."}, *history, *empty_messages(1)]
    response = api.post(
        COMPLETIONS,
        {"model": "small", "messages": messages, "rag": {"enabled": False}},
        format="json",
    )
    assert response.status_code == 200, response.content
    # The question alone, then a binary search over ~500 drops: not one count per drop.
    assert len(counts) <= 12
    sent = upstream.requests[0]["messages"]
    kept = sent[1:-1]
    assert kept == history[len(history) - len(kept) :]  # the most recent turns, in order
    # The most that fit: two turns more (the next drop back) would not.
    tokenizer = FakeTokenizer()
    assert tokenizer.count_chat(sent) == response.json()["usage"]["prompt_tokens"] <= 1_000
    more = history[len(history) - len(kept) - 2 :]
    assert tokenizer.count_chat([sent[0], *more, sent[-1]]) > 1_000
