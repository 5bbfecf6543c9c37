"""LlamaIndex's ``OpenAILike``, unmodified, against the running app: complete and chat,
each whole and streamed, on the fake tier, then once on the real llama.cpp tier.

``OpenAILike`` reaches the chat endpoint with ``is_chat_model=True``; without it, it
speaks the legacy ``/v1/completions``, which ragtier does not serve (404).

Not a pinned test dependency yet: every ``llama-index-llms-openai`` 0.8.x (which
``llama-index-llms-openai-like`` 0.8.1 needs) requires ``openai<3``, and the suite pins
``openai==3.57.0``; these skip where the package is not installed."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from apps.accounts.services import IssuedKey
from apps.usage.models import UsageRecord
from tests.fake_upstream import FakeUpstream

openai_like = pytest.importorskip("llama_index.llms.openai_like")
llms = pytest.importorskip("llama_index.core.llms")

pytestmark = pytest.mark.django_db(transaction=True)

NO_RAG = {"rag": {"enabled": False}}


def model(asgi_server: str, key: IssuedKey, **fields: Any) -> Any:
    fields = {"is_chat_model": True, "max_retries": 0, "timeout": 120, **fields}
    return openai_like.OpenAILike(
        model="small", api_base=f"{asgi_server}/v1", api_key=key.secret, **fields
    )


def ask(text: str) -> list[Any]:
    return [llms.ChatMessage(role="user", content=text)]


def test_complete_and_chat_whole(
    upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey
) -> None:
    llm = model(asgi_server, issued_key, temperature=0.4)
    assert llm.complete("Say hello").text == "Hello world."
    reply = llm.chat([llms.ChatMessage(role="system", content="Be brief."), *ask("Say hello")])
    assert reply.message.content == "Hello world."
    usage = reply.raw.usage
    last = UsageRecord.objects.filter(kind="chat").order_by("pk").last()
    assert last is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        last.prompt_tokens,
        last.completion_tokens,
    )
    assert [sent["temperature"] for sent in upstream.requests] == [0.4, 0.4]
    assert upstream.requests[1]["messages"][0]["content"].endswith("Be brief.")


def test_complete_and_chat_streamed(
    upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey
) -> None:
    upstream.script.delay = 0.05  # each token its own delta, as a tier generating sends
    llm = model(asgi_server, issued_key)
    completed = list(llm.stream_complete("Say hello"))
    assert [part.delta for part in completed if part.delta] == ["Hello", " world", "."]
    assert completed[-1].text == "Hello world."
    chatted = list(llm.stream_chat(ask("Say hello")))
    assert [part.delta for part in chatted if part.delta] == ["Hello", " world", "."]
    assert chatted[-1].message.content == "Hello world."
    assert UsageRecord.objects.filter(kind="chat").count() == 2


def test_without_is_chat_model_it_asks_for_legacy_completions(
    upstream: FakeUpstream, asgi_server: str, issued_key: IssuedKey
) -> None:
    llm = model(asgi_server, issued_key, is_chat_model=False)
    with pytest.raises(openai.NotFoundError):
        llm.complete("Say hello")
    assert upstream.requests == []


@pytest.mark.integration
def test_stream_chat_from_the_real_tier(
    llama_server: str, settings: Any, asgi_server: str, issued_key: IssuedKey
) -> None:
    settings.INFERENCE_BASE_URL = llama_server
    settings.INFERENCE_SERVER = "llama.cpp"
    settings.RESPONSE_CACHE_TTL = 0
    llm = model(
        asgi_server,
        issued_key,
        temperature=0,
        max_tokens=40,
        additional_kwargs={"extra_body": NO_RAG},
    )
    chunks = list(llm.stream_chat(ask("Count from one to twenty, in words, separated by commas.")))
    assert len(chunks) > 1 and chunks[-1].message.content
    record = UsageRecord.objects.get(kind="chat")
    assert 0 < record.completion_tokens <= 40
