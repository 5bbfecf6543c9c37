"""Content parts on ``/v1/chat/completions``: text parts joined as vLLM joins them, any
other part type refused by name before any work, limits checked on the joined text."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def complete(http: httpx.Client, messages: list[dict[str, Any]], **body: Any) -> httpx.Response:
    payload = {"model": "small", "messages": messages, "rag": {"enabled": False}, **body}
    return http.post("/v1/chat/completions", json=payload)


def test_text_parts_are_joined_with_newlines_as_vllm_joins_them(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    # As the Vercel AI SDK and the OpenAI SDK send them: parts in user and system turns.
    response = complete(
        http,
        [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "Earlier"},
            {"role": "assistant", "content": [{"type": "text", "text": "Noted."}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "First line"}, {"type": "text", "text": "x"}],
            },
        ],
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Hello world."
    sent = upstream.requests[0]["messages"]
    assert sent[0]["content"].endswith("Be brief.")
    assert {"role": "assistant", "content": "Noted."} in sent
    assert sent[-1] == {"role": "user", "content": "First line\nx"}


def test_parts_and_the_same_string_count_and_bill_the_same(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    parts = [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello"}]
    as_parts = complete(http, [{"role": "user", "content": parts}], cache=False).json()
    as_text = complete(http, [{"role": "user", "content": "Say\nhello"}], cache=False).json()
    assert as_parts["usage"] == as_text["usage"]
    assert upstream.requests[0]["messages"] == upstream.requests[1]["messages"]


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file", "refusal"])
def test_another_part_type_is_a_400_naming_it(
    upstream: FakeUpstream, http: httpx.Client, kind: str
) -> None:
    parts = [{"type": "text", "text": "What is this?"}, {"type": kind, kind: {"url": "x"}}]
    response = complete(
        http, [{"role": "user", "content": "hi"}, {"role": "user", "content": parts}]
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "unsupported_parameter")
    assert error["param"] == "messages.1.content.1.type"
    assert repr(kind) in error["message"]
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("content", "code", "param"),
    [
        ([], "invalid_value", "messages.0.content"),
        (["just a string"], "invalid_value", "messages.0.content.0"),
        ([{"text": "no type"}], "invalid_value", "messages.0.content.0"),
        ([{"type": "text"}], "invalid_value", "messages.0.content.0.text"),
        ([{"type": "text", "text": 3}], "invalid_value", "messages.0.content.0.text"),
        ({"type": "text", "text": "an object"}, "invalid_value", "messages.0.content"),
        (None, "invalid_value", None),
    ],
)
def test_malformed_parts_are_a_400_before_any_work(
    upstream: FakeUpstream, http: httpx.Client, content: Any, code: str, param: str | None
) -> None:
    response = complete(http, [{"role": "user", "content": content}])
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    assert upstream.requests == []


def test_part_count_and_joined_length_are_limited(
    upstream: FakeUpstream, http: httpx.Client, settings: Any
) -> None:
    settings.MAX_CHAT_MESSAGES, settings.MAX_MESSAGE_CHARS = 4, 10
    many = [{"type": "text", "text": "a"}] * 5
    response = complete(http, [{"role": "user", "content": many}])
    assert response.status_code == 400
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (
        "too_many_content_parts",
        "messages.0.content",
    )
    # Each part is short; joined (with their separators) they are past the limit.
    long = [{"type": "text", "text": "abcd"}] * 3
    response = complete(http, [{"role": "user", "content": long}])
    assert response.status_code == 400
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (
        "context_length_exceeded",
        "messages.0.content",
    )
    assert upstream.requests == []
