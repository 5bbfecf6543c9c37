"""Through the real parts: MiniLM + FAISS retrieval, SmolLM2 served by llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference import client as inference_client
from tests.apps.chat.conftest import ask_stream, conversation_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("real_embedder"),
]

QUESTIONS = json.loads((Path(__file__).parents[2] / "data" / "demo_questions.json").read_text())


def test_three_questions_cite_their_document_with_exact_prompt_tokens(
    llama_server: str,
    http: httpx.Client,
    demo_corpus: dict[int, str],
    settings: Any,
    monkeypatch: Any,
) -> None:
    settings.INFERENCE_BASE_URL = llama_server
    settings.MODEL_ALIASES = {
        "small": {
            **settings.MODEL_ALIASES["small"],
            "context_window": 2048,
            "max_output_tokens": 48,
        }
    }
    filenames = demo_corpus
    sent: list[list[dict[str, str]]] = []
    original = inference_client.OpenAIClient.stream_chat

    def recording(self: Any, request: Any, **options: Any) -> Any:
        sent.append(list(request.messages))
        return original(self, request, **options)

    monkeypatch.setattr(inference_client.OpenAIClient, "stream_chat", recording)
    for item in QUESTIONS[:3]:
        frames = ask_stream(
            http, conversation_for(http), content=item["question"], top_k=3, max_tokens=48
        )
        names = [f["event"] for f in frames]
        assert names[:2] == ["message", "retrieval"] and names[-2:] == ["usage", "done"]
        assert "delta" in names and "error" not in names
        cited = [filenames[c["document_id"]] for c in frames[1]["data"]["citations"]]
        assert item["source"] in cited, (item, cited)
        usage = frames[-2]["data"]
        # llama.cpp sends no usage when streaming: the exact local count stands in, and
        # it equals what the server itself reports for the same prompt.
        assert usage["source"] == "counted"
        served = httpx.post(
            f"{llama_server}/chat/completions",
            timeout=120,
            json={
                "model": "small",
                "messages": sent[-1],
                "max_tokens": 1,
            },
        ).json()["usage"]["prompt_tokens"]
        assert usage["prompt_tokens"] == served
        assert usage["completion_tokens"] >= 1 and usage["ttft_ms"] is not None
