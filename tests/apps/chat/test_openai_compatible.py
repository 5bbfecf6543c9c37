"""The official ``openai`` SDK, unmodified, against the running app."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from apps.usage.models import UsageRecord
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def test_non_streaming_completion_with_usage_details(
    upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    completion = sdk.chat.completions.create(
        model="small",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hello"},
        ],
    )
    assert completion.choices[0].message.content == "Hello world."
    assert completion.choices[0].finish_reason == "stop"
    usage = completion.usage
    assert usage is not None and usage.completion_tokens == 3
    assert usage.total_tokens == usage.prompt_tokens + 3
    assert usage.prompt_tokens_details and usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details and usage.completion_tokens_details.reasoning_tokens == 0
    assert isinstance(completion.model_extra, dict) and "citations" in completion.model_extra
    sent = upstream.requests[0]["messages"]
    assert sent[0]["role"] == "system" and sent[0]["content"].endswith("Be brief.")


def test_stream_with_include_usage_ends_with_a_usage_chunk(
    upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    stream = sdk.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": "Say hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello world."
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["stop"]
    # Streamed and non-streamed answers to the same request record the same usage.
    sdk.chat.completions.create(model="small", messages=[{"role": "user", "content": "Say hello"}])
    # (Nothing but the usage row is stored without ``store: true``.)
    first, second = UsageRecord.objects.filter(kind="chat").order_by("pk")
    assert (first.prompt_tokens, first.completion_tokens) == (
        second.prompt_tokens,
        second.completion_tokens,
    )


def test_errors_map_to_the_sdk_exception_classes(
    upstream: FakeUpstream, asgi_server: str, sdk: openai.OpenAI
) -> None:
    bad = openai.OpenAI(base_url=f"{asgi_server}/v1", api_key="rt_nope_nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        bad.chat.completions.create(model="small", messages=[{"role": "user", "content": "x"}])
    assert auth.value.code == "invalid_api_key"
    with pytest.raises(openai.BadRequestError) as bad_request:
        sdk.chat.completions.create(
            model="small", messages=[{"role": "user", "content": "x"}], max_tokens=10**6
        )
    assert bad_request.value.code == "max_tokens_too_large"
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert upstream.requests == []


def test_models_lists_the_aliases(upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    ids: list[Any] = [model.id for model in sdk.models.list()]
    assert {"small", "large", "auto"} <= set(ids)
