"""``Idempotency-Key`` on ``/v1/chat/completions``, with the native API's rules: a retry
replays the first completion (JSON, or its events re-framed as chunks), another body is
422, a retry while the first runs is 409, a failed first request lets a retry run."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from apps.chat.models import Message
from apps.usage.models import UsageRecord
from tests.apps.chat.test_openai_tools import CALL, WEATHER
from tests.apps.chat.test_queue import wait_until
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def complete(http: httpx.Client, key: str | None, **body: Any) -> dict[str, Any]:
    payload = {
        "model": "small",
        "messages": [{"role": "user", "content": "Say hello"}],
        "rag": {"enabled": False},
        **body,
    }
    headers = {"Idempotency-Key": key} if key else {}
    with http.stream("POST", "/v1/chat/completions", json=payload, headers=headers) as response:
        response.read()
        result: dict[str, Any] = {"status": response.status_code, "headers": response.headers}
        if response.headers["content-type"].startswith("text/event-stream"):
            lines = response.text.splitlines()
            result["chunks"] = [
                line.removeprefix("data: ") for line in lines if line.startswith("data: ")
            ]
        else:
            result["json"] = response.json()
        return result


def test_a_retry_replays_the_completion_and_charges_once(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.script.reasoning = ["Hmm."]
    first = complete(http, "v1-retry")
    again = complete(http, "v1-retry")
    assert first["status"] == again["status"] == 200
    assert "idempotent-replayed" not in first["headers"]
    assert again["headers"]["idempotent-replayed"] == "true"
    body, replayed = first["json"], again["json"]
    assert replayed["choices"] == body["choices"]
    assert replayed["choices"][0]["message"]["reasoning_content"] == "Hmm."
    for name in ("id", "object", "model", "usage", "citations"):
        assert replayed[name] == body[name], name
    assert len(upstream.requests) == 1
    assert UsageRecord.objects.filter(kind="chat").count() == 1
    # The key kept the exchange (a replay needs it), as store: true would.
    assert Message.objects.filter(role="assistant").count() == 1


@pytest.mark.parametrize(
    ("script", "body"),
    [
        ({"tokens": [], "tool_calls": [CALL]}, {"tools": [WEATHER]}),
        ({}, {"logprobs": True, "top_logprobs": 1}),
    ],
    ids=["tool_calls", "logprobs"],
)
def test_a_replay_keeps_the_tool_calls_and_logprobs(
    upstream: FakeUpstream, http: httpx.Client, script: dict[str, Any], body: dict[str, Any]
) -> None:
    for name, value in script.items():
        setattr(upstream.script, name, value)
    first = complete(http, "v1-extras", **body)["json"]
    again = complete(http, "v1-extras", **body)["json"]
    assert again["choices"] == first["choices"]
    choice = first["choices"][0]
    assert choice["message"].get("tool_calls") or choice["logprobs"]["content"]
    assert len(upstream.requests) == 1


def test_a_streamed_completion_replays_its_chunks(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.script.reasoning = ["Hmm."]
    body = {"stream": True, "stream_options": {"include_usage": True}}
    first = complete(http, "v1-stream", **body)
    again = complete(http, "v1-stream", **body)
    assert first["status"] == again["status"] == 200
    assert again["headers"]["idempotent-replayed"] == "true"

    def comparable(chunks: list[str]) -> list[Any]:
        decoded = [c if c == "[DONE]" else json.loads(c) for c in chunks]
        for chunk in decoded:
            if isinstance(chunk, dict):
                chunk.pop("created", None)
        return decoded

    replayed, original = comparable(again["chunks"]), comparable(first["chunks"])
    assert replayed == original
    assert original[-1] == "[DONE]" and original[-2]["usage"]["completion_tokens"] > 0
    assert any(
        "reasoning_content" in c["choices"][0]["delta"] for c in original[:-2] if c["choices"]
    )
    assert len(upstream.requests) == 1
    assert UsageRecord.objects.filter(kind="chat").count() == 1


def test_another_body_with_the_key_is_422(upstream: FakeUpstream, http: httpx.Client) -> None:
    assert complete(http, "v1-reused")["status"] == 200
    other = complete(http, "v1-reused", messages=[{"role": "user", "content": "Other"}])
    assert other["status"] == 422
    assert other["json"]["error"]["code"] == "idempotency_key_reused"
    # Streaming is part of the body: the same key with stream: true is another request.
    assert complete(http, "v1-reused", stream=True)["status"] == 422
    assert len(upstream.requests) == 1


def test_while_the_first_runs_a_retry_is_409(upstream: FakeUpstream, http: httpx.Client) -> None:
    upstream.script.tokens = [f" w{i}" for i in range(20)]
    upstream.script.delay = 0.05
    results: list[dict[str, Any]] = []
    first = threading.Thread(target=lambda: results.append(complete(http, "v1-slow", stream=True)))
    first.start()
    try:
        wait_until(lambda: len(upstream.requests) == 1)
        during = complete(http, "v1-slow", stream=True)
    finally:
        first.join(timeout=30)
    assert during["status"] == 409
    assert during["json"]["error"]["code"] == "idempotency_in_progress"
    assert results[0]["status"] == 200
    assert complete(http, "v1-slow", stream=True)["headers"]["idempotent-replayed"] == "true"
    assert len(upstream.requests) == 1


def test_a_failed_first_request_lets_a_retry_run(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.script.fail_status, upstream.script.fail_times = 500, 100  # past every retry
    assert complete(http, "v1-flaky")["status"] == 502
    upstream.script.fail_status = None
    retried = complete(http, "v1-flaky")
    assert retried["status"] == 200 and "idempotent-replayed" not in retried["headers"]
    assert complete(http, "v1-flaky")["json"]["id"] == retried["json"]["id"]


def test_store_false_with_a_key_is_a_400_before_any_work(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    refused = complete(http, "v1-nostore", store=False)
    assert refused["status"] == 400
    assert (refused["json"]["error"]["code"], refused["json"]["error"]["param"]) == (
        "invalid_value",
        "store",
    )
    # Without a key, store: false keeps nothing, as before.
    assert complete(http, None, store=False)["status"] == 200
    assert not Message.objects.exists()
    assert len(upstream.requests) == 1


def test_an_invalid_key_is_400(upstream: FakeUpstream, http: httpx.Client) -> None:
    refused = complete(http, "x" * 256)
    assert refused["status"] == 400 and refused["json"]["error"]["param"] == "Idempotency-Key"
    assert not upstream.requests
