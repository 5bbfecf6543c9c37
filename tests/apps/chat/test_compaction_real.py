"""Context compaction through the real tier: SmolLM2 served by llama.cpp summarises the
oldest turns of a conversation its window cannot hold, counted with its GGUF tokenizer."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from apps.chat.models import ConversationSummary
from apps.chat.services.registry import tokenizer
from apps.usage.models import UsageRecord
from tests.apps.chat.conftest import ask_stream, conversation_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _window(settings: Any, tokens: int) -> None:
    small = settings.MODEL_ALIASES["small"]
    settings.MODEL_ALIASES = {"small": {**small, "context_window": tokens, "max_output_tokens": 32}}


def test_a_summarize_answer_works_end_to_end(
    llama_server: str, http: httpx.Client, settings: Any
) -> None:
    settings.INFERENCE_BASE_URL = llama_server
    settings.INFERENCE_SERVER = "llama.cpp"
    settings.RESPONSE_CACHE_TTL = 0
    _window(settings, 2048)
    conversation = conversation_for(http)
    for topic in ("apples", "boats", "clocks"):
        content = f"Tell me about {topic}. " + f"{topic} are interesting. " * 40
        ask_stream(http, conversation, content=content, top_k=0, max_tokens=16)
    _window(settings, 512)
    settings.HISTORY_POLICY = "summarize"
    settings.SUMMARY_MAX_TOKENS = 48
    frames = ask_stream(
        http, conversation, content="What did we talk about?", top_k=0, max_tokens=32, tag="e2e"
    )
    names = [f["event"] for f in frames]
    assert "delta" in names and "error" not in names and names[-1] == "done"
    usage = next(f["data"] for f in frames if f["event"] == "usage")
    assert usage["summarized_turns"] >= 2 and usage["prompt_tokens"] <= 512 - 32
    assert usage["dropped_tokens"] > 0
    row = UsageRecord.objects.get(operation="summary")
    assert row.tag == "e2e" and row.prompt_tokens > 0 and 0 < row.completion_tokens <= 48
    summary = ConversationSummary.objects.get(completed_at__isnull=False)
    assert summary.text and summary.tokens == tokenizer("small").count(summary.text)
    ask_stream(http, conversation, content="Thanks.", top_k=0, max_tokens=8)
    assert UsageRecord.objects.filter(operation="summary").count() == 1
