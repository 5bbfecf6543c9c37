"""The ``openai`` npm package on Node, unmodified, and content parts sent raw with ``fetch``
as the Vercel AI SDK sends them, against the running app (``node/clients.mjs``); the fake
tier and the fake embedder, then once the real llama.cpp tier.

Node and the package come from ``npm ci`` (package.json's devDependencies); without them
these skip."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from apps.accounts.services import IssuedKey
from apps.knowledge.services import embedder, embedding_model_name
from apps.usage.models import UsageRecord
from config.env import BASE_DIR
from tests.apps.chat.conftest import client_script
from tests.apps.chat.test_openai_tools import CALL, WEATHER
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = Path(__file__).parent / "node" / "clients.mjs"


@pytest.fixture
def node(asgi_server: str, issued_key: IssuedKey) -> Any:
    """Run one case of ``clients.mjs`` against the app; its printed JSON, decoded."""
    executable = shutil.which("node")
    if executable is None:
        pytest.skip("no node on PATH")
    if not (BASE_DIR / "node_modules" / "openai" / "package.json").is_file():
        pytest.skip("the openai npm package is not installed: npm ci")
    return client_script([executable, str(SCRIPT)], base_url=asgi_server, key=issued_key)


def test_streaming_chat_with_usage(upstream: FakeUpstream, node: Any) -> None:
    upstream.script.delay = 0.05  # each token its own delta, as a tier generating sends
    result = node("streamChat", fields={"temperature": 0.3, "seed": 5})
    assert result["text"] == "Hello world." and result["deltas"] == 3
    assert result["finishReasons"] == ["stop"]
    usage = result["usage"]
    record = UsageRecord.objects.get(kind="chat")
    assert usage["choices"] == 0  # the usage chunk comes last, with no choices
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        record.prompt_tokens,
        record.completion_tokens,
    )
    assert usage["total_tokens"] == usage["prompt_tokens"] + 3
    sent = upstream.requests[0]
    assert (sent["temperature"], sent["seed"]) == (0.3, 5)


def test_embeddings_base64_by_default_and_floats(node: Any) -> None:
    """The npm package asks for base64 unless told otherwise and decodes it itself: both
    formats give the model's vectors."""
    texts = ["How are API keys stored?", "The soup is hot."]
    result = node("embeddings", model=embedding_model_name(), input=texts)
    expected = embedder().embed(texts).vectors
    assert result["indexes"] == [0, 1] and result["model"] == embedding_model_name()
    assert np.allclose(np.asarray(result["vectors"], dtype=np.float32), expected)
    assert np.allclose(np.asarray(result["floats"], dtype=np.float32), expected)
    tokens = embedder().count_embedding_tokens(texts)
    assert result["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert [r.prompt_tokens for r in UsageRecord.objects.filter(kind="embedding")] == [
        tokens,
        tokens,
    ]


def test_errors_are_the_packages_error_classes(upstream: FakeUpstream, node: Any) -> None:
    result = node("errors")
    assert result["temperature"] == {
        "status": 400,
        "code": "invalid_value",
        "param": "temperature",
        "kind": "BadRequestError",
    }
    assert result["image"]["status"] == 400
    assert result["image"]["code"] == "unsupported_parameter"
    assert upstream.requests == []


def test_vercel_content_parts_raw(upstream: FakeUpstream, node: Any) -> None:
    result = node("vercelParts", parts=["What is in the notes?", "Answer in one line."])
    assert result["status"] == 200
    assert result["contentType"].startswith("text/event-stream")
    assert result["text"] == "Hello world." and result["last"] == "[DONE]"
    assert result["usage"]["completion_tokens"] == 3
    sent = upstream.requests[0]["messages"]
    assert sent[-1]["role"] == "user"
    assert sent[-1]["content"].endswith("What is in the notes?\nAnswer in one line.")


def test_tools_streamed_joined_by_the_package_then_the_result_sent_back(
    upstream: FakeUpstream, node: Any
) -> None:
    upstream.script.tokens, upstream.script.tool_calls = [], [CALL]
    upstream.script.delay = 0.02  # each argument piece its own chunk
    result = node("tools", tools=[WEATHER])
    assert result["finishReason"] == "tool_calls" and result["fragments"] > 1
    assert [(c["id"], c["function"]) for c in result["calls"]] == [
        ("call_1", {"name": "get_weather", "arguments": CALL["arguments"]})
    ]
    sent = upstream.requests[1]["messages"]
    assert [m["role"] for m in sent[-2:]] == ["assistant", "tool"]
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}
    assert result["next"]["message"]["tool_calls"][0]["id"] == "call_1"
    assert UsageRecord.objects.filter(kind="chat").count() == 2


@pytest.mark.integration
def test_streaming_chat_from_the_real_tier(llama_server: str, settings: Any, node: Any) -> None:
    settings.INFERENCE_BASE_URL = llama_server
    settings.INFERENCE_SERVER = "llama.cpp"
    settings.RESPONSE_CACHE_TTL = 0
    result = node(
        "streamChat",
        question="Count from one to twenty, in words, separated by commas.",
        fields={"temperature": 0, "seed": 1, "max_tokens": 40, "rag": {"enabled": False}},
    )
    assert result["text"] and result["deltas"] > 1
    assert result["finishReasons"] in (["stop"], ["length"])
    record = UsageRecord.objects.get(kind="chat")
    assert 0 < result["usage"]["completion_tokens"] <= 40
    assert (result["usage"]["prompt_tokens"], result["usage"]["completion_tokens"]) == (
        record.prompt_tokens,
        record.completion_tokens,
    )
