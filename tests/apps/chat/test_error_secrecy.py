"""What an inference failure tells the caller, and keeps: the alias and the kind of failure,
never the upstream's host or address (the ledger keeps the upstream) nor any text the
tier streamed. Through the whole app, on the native event stream and on
``/v1/chat/completions``, against a refused connection, a wire that breaks
(tests/fault_proxy.py) and a tier that sends a broken line (tests/fake_upstream.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from apps.chat.models import Message
from apps.usage.models import UsageRecord
from tests.apps.chat.conftest import conversation_for, parse_sse
from tests.conftest import free_port
from tests.fake_upstream import FakeUpstream
from tests.fault_proxy import FaultProxy

pytestmark = pytest.mark.django_db(transaction=True)

SURFACES = ["native-sse", "openai-sse", "openai-json"]
CANARY = "ACANARY5e1f0c"


@pytest.fixture
def proxy(upstream: FakeUpstream, settings: Any) -> Iterator[FaultProxy]:
    fault = FaultProxy(target=upstream.base_url).start()
    settings.INFERENCE_BASE_URL = fault.base_url
    settings.INFERENCE_RETRY_ATTEMPTS = 1
    yield fault
    fault.stop()


def ask(http: httpx.Client, surface: str) -> tuple[httpx.Response, dict[str, Any]]:
    """The response and the error it carries (in-band for a stream)."""
    if surface == "native-sse":
        conversation = conversation_for(http)
        response = http.post(
            f"/api/v1/conversations/{conversation}/messages",
            json={"content": "Hi", "top_k": 0, "stream": True},
        )
        frames = [f for f in parse_sse(iter(response.text.splitlines())) if "comment" not in f]
        assert [f["event"] for f in frames][-3:] == ["error", "usage", "done"]
        return response, dict(frames[-3]["data"])
    body = {
        "model": "small",
        "messages": [{"role": "user", "content": "Hi"}],
        "rag": {"enabled": False},
        "stream": surface == "openai-sse",
        "store": True,
    }
    response = http.post("/v1/chat/completions", json=body)
    if surface == "openai-json":
        assert response.status_code >= 400, response.text
        return response, dict(response.json()["error"])
    errors = [
        json.loads(line.removeprefix("data: "))["error"]
        for line in response.text.splitlines()
        if line.startswith("data: {") and '"error"' in line
    ]
    assert len(errors) == 1, response.text
    return response, dict(errors[0])


def assert_sealed(response: httpx.Response, error: dict[str, Any], upstream_url: str) -> None:
    """Nothing of where the tier is, in the response or in the stored message; the alias
    and the kind of failure are said; the ledger keeps the upstream."""
    address = urlsplit(upstream_url)
    assert address.hostname and address.port
    assert "Model 'small':" in error["message"], error
    assert address.hostname not in response.text and str(address.port) not in error["message"]
    assert CANARY not in response.text
    stored = json.dumps(list(Message.objects.filter(role="assistant").values("error")))
    assert '"error": null' not in stored  # the failure is stored…
    assert address.hostname not in stored and CANARY not in stored  # …sealed
    record = UsageRecord.objects.get(kind="chat")
    assert record.upstream == upstream_url.rstrip("/")


@pytest.mark.parametrize("surface", SURFACES)
def test_a_refused_connection_names_the_alias_not_the_address(
    upstream: FakeUpstream, http: httpx.Client, settings: Any, surface: str
) -> None:
    refused = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    settings.INFERENCE_BASE_URL = refused
    settings.INFERENCE_RETRY_ATTEMPTS = 1
    response, error = ask(http, surface)
    assert error["code"] == "inference_unavailable"
    assert "refused" in error["message"]
    assert_sealed(response, error, refused)


@pytest.mark.parametrize("surface", SURFACES)
def test_a_broken_wire_names_the_alias_not_the_address(
    proxy: FaultProxy, http: httpx.Client, surface: str
) -> None:
    proxy.mode = "garbage"  # bytes that are not HTTP: aiohttp's error quotes the URL
    response, error = ask(http, surface)
    assert error["code"] == "inference_unavailable"
    assert_sealed(response, error, proxy.base_url)


@pytest.mark.parametrize("surface", SURFACES)
def test_a_broken_line_is_reported_by_its_size_not_its_text(
    upstream: FakeUpstream, http: httpx.Client, surface: str
) -> None:
    line = b'data: {"choices": [{"delta": {"content": " ' + CANARY.encode() + b" is the"
    upstream.script.malformed_after, upstream.script.malformed_line = 0, line + b"\n\n"
    response, error = ask(http, surface)
    assert error["code"] == "inference_protocol_error"
    assert f"a {len(line) - len(b'data: ')}-byte line" in error["message"]
    assert_sealed(response, error, upstream.base_url)
