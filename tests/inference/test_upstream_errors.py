"""Every server's error dialect maps to one exception of this package (and so to one
status and code of API.md), and the tier's own words never reach the caller."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest

from inference.client import ChatRequest, OpenAIClient, Retry, upstream_error
from inference.errors import (
    ContextLengthExceeded,
    InferenceError,
    InferenceUnavailable,
    UpstreamRateLimited,
    UpstreamRejected,
)

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
TGI_CONTEXT = {
    "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
    "Given: 4000 `inputs` tokens and 200 `max_new_tokens`",
    "error_type": "validation",
}
TGI_INVALID = {
    "error": "Input validation error: `temperature` must be strictly positive",
    "error_type": "validation",
}
SECRET_TEXT = "http://10.0.0.7:8000 internal detail"

CASES: list[tuple[str, int | None, str, type[InferenceError], int]] = [
    # (what, HTTP status or None for a line inside a stream, body, error, API status)
    ("vllm context", 400, (WIRE / "vllm-0.30/error_context_length.json").read_text(),
     ContextLengthExceeded, 400),
    ("llama.cpp context", 400,
     (WIRE / "llama-cpp-python-0.3.36/error_context_length.json").read_text(),
     ContextLengthExceeded, 400),
    ("tgi context", 422, json.dumps(TGI_CONTEXT), ContextLengthExceeded, 400),
    ("tgi validation", 422, json.dumps(TGI_INVALID), UpstreamRejected, 400),
    ("vllm bad request", 400,
     json.dumps({"error": {"message": SECRET_TEXT, "type": "BadRequestError", "code": 400}}),
     UpstreamRejected, 400),
    ("vllm context mid-stream", None,
     json.dumps({"error": {"message": "maximum context length is 4096", "code": 400}}),
     ContextLengthExceeded, 400),
    ("vllm engine error mid-stream", None,
     json.dumps({"error": {"message": SECRET_TEXT, "type": "InternalServerError", "code": 500}}),
     InferenceUnavailable, 502),
    ("rate limited", 429, json.dumps({"error": {"message": SECRET_TEXT}}),
     UpstreamRateLimited, 429),
    ("overloaded", 503, "Service Unavailable", InferenceUnavailable, 502),
    ("bare string error", 500, json.dumps({"error": SECRET_TEXT}), InferenceUnavailable, 502),
    ("unknown model", 404, json.dumps({"error": {"message": SECRET_TEXT, "code": 404}}),
     InferenceError, 502),
]  # fmt: skip


@pytest.mark.parametrize(("what", "status", "body", "error", "api_status"), CASES)
def test_each_dialect_maps_to_one_error(
    what: str, status: int | None, body: str, error: type[InferenceError], api_status: int
) -> None:
    mapped = upstream_error(status, body, {})
    assert type(mapped) is error, what
    assert mapped.status == api_status
    assert SECRET_TEXT not in str(mapped)
    assert "4096" not in str(mapped)


def test_retry_after_in_both_forms() -> None:
    assert upstream_error(429, "{}", {"retry-after": "120"}).retry_after == 120
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=90), usegmt=True)
    waited = upstream_error(503, "{}", {"retry-after": later}).retry_after
    assert waited is not None and 85 <= waited <= 90
    past = format_datetime(datetime.now(UTC) - timedelta(hours=1), usegmt=True)
    assert upstream_error(503, "{}", {"retry-after": past}).retry_after == 0
    assert upstream_error(503, "{}", {"retry-after": "soon"}).retry_after is None


async def test_a_long_retry_after_is_handed_on_in_full_not_waited_out() -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(429, json={"error": {}}, headers={"retry-after": "120"})

    client = OpenAIClient(
        base_url="http://tier/v1",
        transport=httpx.MockTransport(handler),
        retry=Retry(attempts=3, base_delay=0.0, max_delay=8.0),
    )
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    with pytest.raises(UpstreamRateLimited) as raised:
        async for _ in client.stream_chat(request):
            pass
    assert raised.value.retry_after == 120  # not capped at the client's 8 s backoff
    assert len(calls) == 1
