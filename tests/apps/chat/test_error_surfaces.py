"""One status map: every error an answer can meet, on every surface, stream or not.

Before the stream starts an error is the response itself (its status, code and headers
from the one exception handler); after, it goes in-band, then the stream ends as usual.
A non-streaming answer that failed with no content answers the same status and code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from apps.usage.models import UsageRecord
from tests.apps.chat.conftest import conversation_for, parse_sse
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

# code (":" and the case, when several tier dialects lead to it) → (status, type, what the
# fake tier does)
FAULTS: dict[str, tuple[int, str, dict[str, Any]]] = {
    "inference_unavailable": (
        502,
        "upstream_error",
        {"fail_status": 503, "fail_times": 99, "retry_after": "7"},
    ),
    "inference_timeout": (504, "upstream_error", {"stall_after": 0}),
    "inference_protocol_error": (502, "upstream_error", {"malformed_after": 0}),
    "context_length_exceeded": (
        400,
        "invalid_request_error",
        {"fail_status": 400, "fail_code": "context_length_exceeded"},
    ),
    "context_length_exceeded:vllm": (  # vLLM: an integer code, the reason in the message
        400,
        "invalid_request_error",
        {
            "fail_status": 400,
            "fail_code": 400,
            "fail_message": "This model's maximum context length is 4096 tokens.",
        },
    ),
    "invalid_request": (400, "invalid_request_error", {"fail_status": 422, "fail_code": 422}),
    "inference_rate_limited": (
        429,
        "rate_limit_error",
        {"fail_status": 429, "fail_times": 99, "retry_after": "120"},
    ),
    "reasoning_budget_exhausted": (
        400,
        "invalid_request_error",
        {"reasoning": ["hmm"] * 3, "tokens": [], "finish_reason": "length"},
    ),
}
RETRY_AFTER = {"inference_unavailable": "7", "inference_rate_limited": "120"}  # the tier's, in full
SURFACES = ["native-json", "native-sse", "openai-json", "openai-sse"]


@pytest.fixture
def faulty(upstream: FakeUpstream, settings: Any) -> FakeUpstream:
    settings.INFERENCE_RETRY_ATTEMPTS = 1
    settings.INFERENCE_TIMEOUTS = {**settings.INFERENCE_TIMEOUTS, "first_token": 0.5}
    return upstream


def ask(http: httpx.Client, surface: str) -> httpx.Response:
    if surface.startswith("native"):
        stream = surface.endswith("sse")
        return http.post(
            f"/api/v1/conversations/{conversation_for(http)}/messages",
            json={"content": "Hi", "top_k": 0, "stream": stream},
        )
    return http.post(
        "/v1/chat/completions",
        json={
            "model": "small",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": surface.endswith("sse"),
            "rag": {"enabled": False},
        },
    )


def in_band_error(surface: str, response: httpx.Response) -> dict[str, Any]:
    lines: Iterator[str] = iter(response.text.splitlines())
    if surface == "native-sse":
        frames = [f for f in parse_sse(lines) if "comment" not in f]
        assert [f["event"] for f in frames][-3:] == ["error", "usage", "done"]
        error: dict[str, Any] = frames[-3]["data"]
        return error
    payloads = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    errors = [json.loads(p)["error"] for p in payloads[:-1] if '"error"' in p]
    assert len(errors) == 1
    return dict(errors[0])


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("code", list(FAULTS))
def test_each_error_code_on_each_surface(
    faulty: FakeUpstream, http: httpx.Client, surface: str, code: str
) -> None:
    status, kind, fault = FAULTS[code]
    for name, value in fault.items():
        setattr(faulty.script, name, value)
    response = ask(http, surface)
    if surface.endswith("sse"):
        assert response.status_code == 200  # the stream had started: the error is in-band
        error = in_band_error(surface, response)
    else:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        if code in RETRY_AFTER:
            assert response.headers["Retry-After"] == RETRY_AFTER[code]
    code = code.partition(":")[0]
    assert (error["code"], error["type"]) == (code, kind)
    assert set(error) == {"type", "code", "message", "param"}
    row = UsageRecord.objects.get(kind="chat")
    assert (row.status, row.error_code) == ("error", code)
