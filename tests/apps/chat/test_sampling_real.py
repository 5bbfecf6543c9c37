"""Sampling fields through the real tier: SmolLM2 served by llama.cpp (llama-cpp-python's
server), spoken to in its dialect."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from apps.accounts.services import IssuedKey

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
