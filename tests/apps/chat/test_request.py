"""The one typed request an answer is prepared from: what each surface's input serializer
builds from a body, and the sampling parameters it carries to the tier and the cache key."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any

import pytest

from apps.accounts.models import Team
from apps.accounts.selectors import Caller
from apps.chat.apis import ConversationMessageCreateApi
from apps.chat.openai_apis import ChatCompletionsApi
from apps.chat.services import AnswerRequest, ModelChoice
from apps.core.exceptions import InvalidRequest

CALLER = Caller(team=Team(pk=1, name="t"), user=None, api_key=None, scopes=frozenset({"chat"}))
MODEL = ModelChoice(requested="small", candidates=())


def validated(serializer_class: type[Any], body: dict[str, Any]) -> dict[str, Any]:
    serializer = serializer_class(data=body)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def test_the_native_body_becomes_a_request_for_its_conversation() -> None:
    serializer = ConversationMessageCreateApi.InputSerializer
    body = {"content": "Why?", "collections": [3, 2], "top_k": 0, "max_tokens": 7}
    request = serializer.to_request(
        validated(serializer, body), caller=CALLER, model=MODEL, conversation=9
    )
    assert request.conversation == 9
    assert request.content == "Why?"
    assert request.collection_ids == (3, 2)
    assert (request.rag, request.top_k, request.max_tokens) == (False, 0, 7)
    assert request.history is None  # the conversation's stored turns
    assert request.cache and request.store and not request.want_reasoning


def test_the_openai_body_becomes_a_request_with_its_own_history() -> None:
    serializer = ChatCompletionsApi.InputSerializer
    body = {
        "model": "small",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "developer", "content": "Cite."},
            {"role": "user", "content": "Why?"},
        ],
        "max_tokens": 6,
        "max_completion_tokens": 6,
        "rag": {"collections": [4], "top_k": 2},
        "cache": False,
    }
    request = serializer.to_request(validated(serializer, body), caller=CALLER, model=MODEL)
    assert request.conversation is None
    assert request.content == "Why?"
    assert request.history == (
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    )
    assert request.instructions == "Be brief.\n\nCite."
    assert (request.collection_ids, request.top_k, request.rag) == ((4,), 2, True)
    assert request.max_tokens == 6
    assert not request.cache and not request.store


def test_an_openai_body_must_end_with_the_users_message() -> None:
    body = {"model": "small", "messages": [{"role": "assistant", "content": "Hi"}]}
    with pytest.raises(InvalidRequest) as refused:
        validated(ChatCompletionsApi.InputSerializer, body)
    assert refused.value.param == "messages"


def test_a_request_is_frozen() -> None:
    request = AnswerRequest(caller=CALLER, model=MODEL, content="Hi")
    with pytest.raises(FrozenInstanceError):
        request.content = "Bye"  # type: ignore[misc]


def test_sampling_holds_the_sampling_fields_the_caller_set() -> None:
    assert AnswerRequest(caller=CALLER, model=MODEL, content="Hi").sampling == {}
    request = AnswerRequest(caller=CALLER, model=MODEL, content="Hi", temperature=0.2, user="u")
    assert request.sampling == {"temperature": 0.2}  # ``user`` changes no output: not keyed
    assert request.tier_sampling.fields() == {"temperature": 0.2, "user": "u"}
