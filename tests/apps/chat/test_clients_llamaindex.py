"""LlamaIndex's ``OpenAILike``, unmodified, against the running app (``llamaindex/
clients.py``): complete and chat, each whole and streamed, and a tool call, on the fake
tier, then once on the real llama.cpp tier.

LlamaIndex runs in an environment of its own (``llamaindex/requirements.txt``, which
``make test`` builds as ``.venv-llamaindex``): every ``llama-index-llms-openai`` 0.8.x
(which ``llama-index-llms-openai-like`` 0.8.1 needs) requires ``openai<3``, and this suite
pins ``openai`` 3. Without that environment these skip.

``OpenAILike`` reaches the chat endpoint with ``is_chat_model=True``; without it, it
speaks the legacy ``/v1/completions``, which ragtier does not serve (404)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.accounts.services import IssuedKey
from apps.usage.models import UsageRecord
from config.env import BASE_DIR
from tests.apps.chat.conftest import client_script
from tests.apps.chat.test_openai_tools import CALL
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = Path(__file__).parent / "llamaindex" / "clients.py"
PYTHON = BASE_DIR / ".venv-llamaindex" / "bin" / "python"
NO_RAG = {"rag": {"enabled": False}}


@pytest.fixture
def llamaindex(asgi_server: str, issued_key: IssuedKey) -> Any:
    """Run one case of ``clients.py`` against the app; its printed JSON, decoded."""
    if not PYTHON.is_file():
        pytest.skip("LlamaIndex's environment is not built: make test")
    return client_script([str(PYTHON), str(SCRIPT)], base_url=asgi_server, key=issued_key)


def test_complete_and_chat_whole(upstream: FakeUpstream, llamaindex: Any) -> None:
    result = llamaindex("whole")
    assert result["complete"] == result["chat"] == "Hello world."
    last = UsageRecord.objects.filter(kind="chat").order_by("pk").last()
    assert last is not None
    assert result["usage"] == [last.prompt_tokens, last.completion_tokens]
    assert [sent["temperature"] for sent in upstream.requests] == [0.4, 0.4]
    assert upstream.requests[1]["messages"][0]["content"].endswith("Be brief.")


def test_complete_and_chat_streamed(upstream: FakeUpstream, llamaindex: Any) -> None:
    upstream.script.delay = 0.05  # each token its own delta, as a tier generating sends
    result = llamaindex("streamed")
    assert result["completeDeltas"] == result["chatDeltas"] == ["Hello", " world", "."]
    assert result["completeText"] == result["chatText"] == "Hello world."
    assert UsageRecord.objects.filter(kind="chat").count() == 2


def test_without_is_chat_model_it_asks_for_legacy_completions(
    upstream: FakeUpstream, llamaindex: Any
) -> None:
    assert llamaindex("legacy") == {"status": 404}
    assert upstream.requests == []


def test_chat_with_tools_gets_the_call(upstream: FakeUpstream, llamaindex: Any) -> None:
    upstream.script.tokens, upstream.script.tool_calls = [], [CALL]
    result = llamaindex("tools", extra=NO_RAG)
    assert result["calls"] == [["call_1", "get_weather", {"city": "Paris"}]]
    tools = upstream.requests[0]["tools"]
    assert [tool["function"]["name"] for tool in tools] == ["get_weather"]


@pytest.mark.integration
def test_stream_chat_from_the_real_tier(llama_server: str, settings: Any, llamaindex: Any) -> None:
    settings.INFERENCE_BASE_URL = llama_server
    settings.INFERENCE_SERVER = "llama.cpp"
    settings.RESPONSE_CACHE_TTL = 0
    question = "Count from one to twenty, in words, separated by commas."
    result = llamaindex("real", question=question, extra=NO_RAG)
    assert result["chunks"] > 1 and result["text"]
    record = UsageRecord.objects.get(kind="chat")
    assert 0 < record.completion_tokens <= 40
