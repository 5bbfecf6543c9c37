"""Reasoning on ``/v1/chat/completions``: returned as ``reasoning_content`` (in deltas and
in the message), as vLLM and DeepSeek send it, whenever the tier produced reasoning;
counted as the native API counts it."""

from __future__ import annotations

import openai
import pytest

from apps.usage.models import UsageRecord
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

ASK = [{"role": "user", "content": "Think first"}]


def extra(model: object, name: str) -> object:
    fields = getattr(model, "model_extra", None) or {}
    return fields.get(name)


@pytest.mark.parametrize("inline", [False, True], ids=["reasoning_content", "think_tags"])
def test_reasoning_comes_back_in_the_message_and_is_counted(
    upstream: FakeUpstream, sdk: openai.OpenAI, inline: bool
) -> None:
    if inline:  # llama.cpp without a reasoning parser: the tags inline in the content
        upstream.script.tokens = ["<think>", "Let me ", "think.", "</think>", "Hello."]
    else:  # vLLM with --reasoning-parser
        upstream.script.reasoning, upstream.script.tokens = ["Let me ", "think."], ["Hello."]
    completion = sdk.chat.completions.create(
        model="small", messages=ASK, extra_body={"rag": {"enabled": False}}
    )  # type: ignore[arg-type]
    message = completion.choices[0].message
    assert message.content == "Hello."
    assert extra(message, "reasoning_content") == "Let me think."
    usage = completion.usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens > 0
    record = UsageRecord.objects.get(kind="chat")
    assert record.reasoning_tokens == usage.completion_tokens_details.reasoning_tokens
    assert record.completion_tokens == usage.completion_tokens


def test_reasoning_streams_as_reasoning_content_deltas_before_the_answer(
    upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    upstream.script.reasoning, upstream.script.tokens = ["Let me ", "think."], ["Hel", "lo."]
    stream = sdk.chat.completions.create(
        model="small",
        messages=ASK,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"rag": {"enabled": False}},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thoughts = [extra(d, "reasoning_content") for d in deltas if extra(d, "reasoning_content")]
    assert "".join(str(t) for t in thoughts) == "Let me think."  # adjacent deltas may merge
    assert "".join(d.content or "" for d in deltas) == "Hello."
    first_text = next(i for i, d in enumerate(deltas) if d.content)
    last_thought = max(i for i, d in enumerate(deltas) if extra(d, "reasoning_content"))
    assert last_thought < first_text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    reasoning_tokens = usage.completion_tokens_details.reasoning_tokens
    assert reasoning_tokens > 0  # the tier sent no usage: counted with the tokenizer
    assert UsageRecord.objects.get(kind="chat").reasoning_tokens == reasoning_tokens


def test_no_reasoning_no_field(upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(model="small", messages=ASK)  # type: ignore[arg-type]
    assert "reasoning_content" not in (completion.choices[0].message.model_extra or {})
    chunks = list(sdk.chat.completions.create(model="small", messages=ASK, stream=True))  # type: ignore[arg-type]
    assert not any(extra(c.choices[0].delta, "reasoning_content") for c in chunks if c.choices)
