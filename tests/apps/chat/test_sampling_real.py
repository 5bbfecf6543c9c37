"""Sampling fields through the real tier: SmolLM2 served by llama.cpp (llama-cpp-python's
server), spoken to in its dialect."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from apps.accounts.services import IssuedKey
from tests.conftest import llama_server_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ASK = [{"role": "user", "content": "Count from one to twenty, in words, separated by commas."}]


@pytest.fixture
def sdk(
    llama_server: str, asgi_server: str, issued_key: IssuedKey, settings: Any
) -> Iterator[openai.OpenAI]:
    settings.INFERENCE_BASE_URL = llama_server
    settings.INFERENCE_SERVER = "llama.cpp"
    settings.RESPONSE_CACHE_TTL = 0  # each answer generated, none replayed
    client = openai.OpenAI(
        base_url=f"{asgi_server}/v1", api_key=issued_key.secret, max_retries=0, timeout=120
    )
    yield client
    client.close()


def _answer(sdk: openai.OpenAI, **fields: Any) -> tuple[str, str | None]:
    completion = sdk.chat.completions.create(
        model="small", messages=ASK, max_tokens=40, extra_body={"rag": {"enabled": False}}, **fields
    )
    choice = completion.choices[0]
    return choice.message.content or "", choice.finish_reason


def test_temperature_zero_and_a_seed_give_the_same_answer_twice(sdk: openai.OpenAI) -> None:
    first, _ = _answer(sdk, temperature=0, seed=1)
    second, _ = _answer(sdk, temperature=0, seed=1)
    assert first and first == second


def test_stop_ends_the_answer_before_the_sequence(sdk: openai.OpenAI) -> None:
    whole, _ = _answer(sdk, temperature=0, seed=1)
    assert "," in whole, whole
    cut, reason = _answer(sdk, temperature=0, seed=1, stop=[","])
    assert reason == "stop" and "," not in cut
    assert whole.startswith(cut)


@pytest.fixture(scope="module")
def llama_logprobs_server() -> Iterator[str]:
    """The embedded tier started to keep every position's logits (INFERENCE_LOGITS_ALL),
    which llama-cpp-python needs to return log probabilities."""
    yield from llama_server_run(n_ctx=512, INFERENCE_LOGITS_ALL="1")


def test_logprobs_come_back_from_the_tier_in_openais_shape(
    sdk: openai.OpenAI, llama_logprobs_server: str, settings: Any
) -> None:
    settings.INFERENCE_BASE_URL = llama_logprobs_server
    completion = sdk.chat.completions.create(
        model="small",
        messages=ASK,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"rag": {"enabled": False}},
    )
    choice = completion.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    entries = choice.logprobs.content
    assert "".join(entry.token for entry in entries) == choice.message.content
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 for entry in entries)
    # Greedy decoding: each token is the likeliest at its position.
    assert all(entry.top_logprobs[0].token == entry.token for entry in entries)


def test_logprobs_are_refused_by_name_where_the_tier_keeps_no_logits(
    sdk: openai.OpenAI, settings: Any
) -> None:
    settings.INFERENCE_UNSUPPORTED = ["logprobs"]  # the embedded default's
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="small", messages=ASK, max_tokens=8, logprobs=True)
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["param"] == "logprobs"
