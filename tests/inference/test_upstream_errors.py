"""Every server's error dialect maps to one exception of this package (and so to one
status and code of the HTTP contract), and the tier's own words never reach the caller."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest

from inference import ChatRequest, OpenAIClient, Retry
from inference.dialects import upstream_error
from inference.errors import (
    ContextLengthExceeded,
    InferenceError,
    InferenceTimeout,
    InferenceUnavailable,
    UpstreamProtocolError,
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


def test_a_request_carries_its_cache_salt_only_when_given() -> None:
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert "cache_salt" not in request.body()
    salted = request.for_model(model="n", max_tokens=2, reasoning_opened=False, cache_salt="s1")
    assert salted.body()["cache_salt"] == "s1" and salted.body()["model"] == "n"
    assert "s1" not in repr(salted)


async def failure_of(handler: httpx.MockTransport) -> InferenceError:
    client = OpenAIClient(
        base_url="http://10.0.0.7:8000/v1",
        transport=handler,
        retry=Retry(attempts=1),
    )
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    with pytest.raises(InferenceError) as raised:
        async for _ in client.stream_chat(request):
            pass
    return raised.value


@pytest.mark.parametrize(
    ("fault", "error", "says"),
    [
        (httpx.ConnectError, InferenceUnavailable, "refused or failed"),
        (httpx.ConnectTimeout, InferenceTimeout, "connection timed out"),
        (httpx.RemoteProtocolError, InferenceUnavailable, "broke off"),
        (httpx.ReadError, InferenceUnavailable, "connection failed"),
    ],
)
async def test_a_transport_failure_is_named_by_its_kind_never_its_address(
    fault: type[httpx.TransportError], error: type[InferenceError], says: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise fault(f"Cannot connect to host 10.0.0.7:8000 ssl:default [{SECRET_TEXT}]")

    failure = await failure_of(httpx.MockTransport(handler))
    assert type(failure) is error
    assert says in str(failure)
    assert "10.0.0.7" not in str(failure) and "8000" not in str(failure)


async def test_a_broken_stream_line_is_told_by_its_size_never_its_text() -> None:
    line = b'data: {"choices": [{"delta": {"content": "the secret answer'
    body = b'data: {"choices": [{"delta": {"content": "Hi"}}]}\n\n' + line + b"\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    failure = await failure_of(httpx.MockTransport(handler))
    assert type(failure) is UpstreamProtocolError
    assert "secret" not in str(failure)
    assert f"a {len(line) - len(b'data: ')}-byte line" in str(failure)
