"""Whole answers through the app against a tier on a real socket that replays what each
server sends (tests/fixtures/wire): usage the tier omits is counted, usage it sends is
taken, TGI's finish reasons and errors reach the client in the HTTP contract's terms, and Ollama's
context window is read from ``/api/show``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from apps.chat.services.tier import _windows
from apps.usage.models import UsageRecord
from inference import FakeTokenizer
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.fake_upstream import ServerThread

pytestmark = pytest.mark.django_db(transaction=True)

WIRE = Path(__file__).resolve().parents[2] / "fixtures" / "wire"


class ReplayTier:
    """Answers every chat request with one recorded transcript (or error body)."""

    def __init__(self) -> None:
        self.transcript = "ollama-0.5.1/chat_stream.sse"
        self.status = 200
        self.show: str | None = None
        self.requests: list[dict[str, Any]] = []

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models),
                Route("/api/show", self._show, methods=["POST"]),
            ]
        )

    async def _chat(self, request: Request) -> Response:
        self.requests.append(await request.json())
        body = (WIRE / self.transcript).read_bytes()
        kind = "text/event-stream" if self.transcript.endswith(".sse") else "application/json"
        return Response(body, status_code=self.status, media_type=kind)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "llama3.2:3b"}]})

    async def _show(self, request: Request) -> Response:
        if self.show is None:
            return JSONResponse({"error": "not found"}, status_code=404)
        return Response((WIRE / self.show).read_bytes(), media_type="application/json")


@pytest.fixture
def tier(settings: Any) -> Iterator[ReplayTier]:
    replay = ReplayTier()
    with ServerThread(replay.app()) as url:
        settings.INFERENCE_BASE_URL = f"{url}/v1"
        settings.TOKENIZER_BACKEND = "inference.tokenizers.FakeTokenizer"
        settings.TOKENIZER_OPTIONS = {}
        settings.INFERENCE_RETRY_ATTEMPTS = 1
        yield replay


def usage_of(frames: list[dict[str, Any]]) -> dict[str, Any]:
    return next(f["data"] for f in frames if f["event"] == "usage")


def test_ollama_without_usage_is_counted_and_its_window_read_from_api_show(
    tier: ReplayTier, http: httpx.Client, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _windows.clear()
    settings.MODEL_ALIASES = {
        "small": {"served_name": "llama3.2:3b", "context_window": None, "max_output_tokens": 64}
    }
    tier.show = "ollama-0.33/show_num_ctx.json"
    with caplog.at_level(logging.WARNING, logger="inference.dialects"):
        frames = ask_stream(http, conversation_for(http), content="What colour is the sky?")
    _windows.clear()
    assert "silently truncates" in caplog.text  # num_ctx 8192 < the model's 131072
    assert "".join(f["data"]["text"] for f in frames if f["event"] == "delta") == (
        "The sky is blue."
    )
    usage = usage_of(frames)
    assert usage["source"] == "counted"
    assert usage["completion_tokens"] == FakeTokenizer().count("The sky is blue.")
    row = UsageRecord.objects.get(kind=UsageRecord.Kind.CHAT)
    assert (row.prompt_tokens, row.completion_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )


@pytest.mark.parametrize(
    ("transcript", "prompt_tokens", "completion_tokens"),
    [
        ("ollama-0.33/chat_stream_usage.sse", 31, 5),
        ("tgi-3.3/chat_stream_usage.sse", 42, 8),
        ("tgi-3.3/chat_stream_usage_on_final_chunk.sse", 42, 5),
        ("triton-openai-25.08/chat_stream_usage.sse", 39, 8),
    ],
)
def test_usage_the_tier_sends_is_what_is_billed(
    tier: ReplayTier,
    http: httpx.Client,
    transcript: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> None:
    tier.transcript = transcript
    frames = ask_stream(http, conversation_for(http), content="Hi")
    usage = usage_of(frames)
    assert (usage["source"], usage["prompt_tokens"], usage["completion_tokens"]) == (
        "upstream",
        prompt_tokens,
        completion_tokens,
    )
    assert frames[-1]["event"] == "done"
    assert tier.requests[-1]["stream_options"] == {"include_usage": True}


def test_tgi_and_triton_errors_in_api_terms(tier: ReplayTier, http: httpx.Client) -> None:
    conversation = conversation_for(http)
    url = f"/api/v1/conversations/{conversation}/messages"
    tier.transcript, tier.status = "tgi-3.3/error_context_length.json", 422
    response = http.post(url, json={"content": "Hi"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    tier.transcript, tier.status = "tgi-3.3/error_overloaded.json", 429
    assert http.post(url, json={"content": "Hi"}).status_code == 429
    tier.transcript, tier.status = "triton-openai-25.08/error_unknown_model.json", 400
    response = http.post(url, json={"content": "Hi"})
    assert response.status_code == 502
    assert "llama-3.1-70b" not in response.text

    tier.transcript, tier.status = "tgi-3.3/chat_stream_error.sse", 200
    frames = ask_stream(http, conversation_for(http), content="Hi")
    names = [f["event"] for f in frames]
    assert names[-3:] == ["error", "usage", "done"] and "delta" in names
    assert "CUDA" not in str(frames)
