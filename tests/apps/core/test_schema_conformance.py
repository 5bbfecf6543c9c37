"""The typed responses, met on purpose: schemathesis's fuzzing (``test_schema.py``) rarely
gets past validation to a 2xx, so each typed operation is called here with a request that
succeeds, through the live ASGI app and the fake inference tier, and its response (each
SSE event's JSON data included) validated against the schema. The schema can fail: a
response that breaks it in one field is refused."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.core.failures import Failure, FailureGroup

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey
from apps.usage.models import Limit
from config.asgi import application
from tests import factories
from tests.apps.core.test_schema import CHECKS

# As in test_schema.py: loaded at import, before the test environment's ALLOWED_HOSTS.
schema = schemathesis.openapi.from_asgi("/api/schema/", application, headers={"Host": "localhost"})

QUESTION = "What does the pump move?"


@pytest.fixture(autouse=True)
def _live(transactional_db: None, upstream: Any) -> None:
    """The app answers from its own threads; the fake inference tier behind the answers."""


@pytest.fixture
def corpus(team: Team) -> int:
    """A collection with one passage the question finds, so that answers cite."""
    collection = factories.collection(team=team)
    factories.document(
        collection=collection, title="pump", text="The pump moves water uphill to the tank."
    )
    return int(collection.pk)


def _call(
    key: IssuedKey, method: str, path: str, *, accept: str = "application/json", **parts: Any
) -> Any:
    """The operation called as the schema documents it, and every check run on its reply."""
    case = schema[path][method].Case(**parts)
    headers = {"Authorization": f"Bearer {key.secret}", "Accept": accept}
    return case.call_and_validate(headers=headers, checks=CHECKS)


def _chat(key: IssuedKey, *, stream: bool = False) -> Any:
    body = {
        "model": "small",
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
        "temperature": 0,
        "stream": stream,
        "stream_options": {"include_usage": True},
    }
    accept = "text/event-stream" if stream else "application/json"
    return _call(key, "POST", "/v1/chat/completions", body=body, accept=accept)


def test_chat_completion(issued_key: IssuedKey, corpus: int) -> None:
    response = _chat(issued_key)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["citations"], body
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_chat_completion_stream(issued_key: IssuedKey, corpus: int) -> None:
    response = _chat(issued_key, stream=True)
    assert response.status_code == 200
    assert response.headers["content-type"][0].startswith("text/event-stream")
    text = response.content.decode()
    assert (
        '"citations":[{' in text and '"usage":{' in text and text.endswith("data: [DONE]\r\n\r\n")
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_completion_that_calls_a_tool(issued_key: IssuedKey, upstream: Any, stream: bool) -> None:
    from tests.apps.chat.test_openai_tools import CALL, WEATHER

    upstream.script.tokens, upstream.script.tool_calls = [], [CALL]
    body = {
        "model": "small",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER],
        "rag": {"enabled": False},
        "stream": stream,
    }
    accept = "text/event-stream" if stream else "application/json"
    response = _call(issued_key, "POST", "/v1/chat/completions", body=body, accept=accept)
    assert response.status_code == 200
    assert '"tool_calls"' in response.content.decode()


def test_models_and_embeddings(issued_key: IssuedKey) -> None:
    models = _call(issued_key, "GET", "/v1/models").json()
    names = [model["id"] for model in models["data"]]
    embedding_model = names[-1]
    for encoding in ("float", "base64"):
        body = {"model": embedding_model, "input": ["one", "two"], "encoding_format": encoding}
        response = _call(issued_key, "POST", "/v1/embeddings", body=body)
        assert response.status_code == 200 and len(response.json()["data"]) == 2


def test_an_estimate(issued_key: IssuedKey, corpus: int) -> None:
    created = _call(issued_key, "POST", "/api/v1/conversations", body={"collections": [corpus]})
    body = {"content": QUESTION, "conversation": created.json()["id"], "max_tokens": 20}
    estimate = _call(issued_key, "POST", "/api/v1/estimate", body=body)
    assert estimate.status_code == 200 and estimate.json()["admitted"] is True


def test_native_answer_its_replay_and_conversation(issued_key: IssuedKey, corpus: int) -> None:
    created = _call(issued_key, "POST", "/api/v1/conversations", body={"collections": [corpus]})
    conversation = {"conversation_id": created.json()["id"]}
    answered = _call(
        issued_key,
        "POST",
        "/api/v1/conversations/{conversation_id}/messages",
        path_parameters=conversation,
        body={"content": QUESTION, "temperature": 0.5},
    )
    assert answered.status_code == 201 and answered.json()["citations"]
    streamed = _call(
        issued_key,
        "POST",
        "/api/v1/conversations/{conversation_id}/messages",
        path_parameters=conversation,
        body={"content": QUESTION, "stream": True, "cache": False},
        accept="text/event-stream",
    )
    assert b"event: retrieval" in streamed.content and b"event: done" in streamed.content
    replayed = _call(
        issued_key,
        "GET",
        "/api/v1/messages/{message_id}/events",
        path_parameters={"message_id": answered.json()["id"]},
        accept="text/event-stream",
    )
    assert b"event: usage" in replayed.content
    detail = _call(
        issued_key, "GET", "/api/v1/conversations/{conversation_id}", path_parameters=conversation
    )
    assert len(detail.json()["messages"]) == 4


def test_usage_and_quota(team: Team, issued_key: IssuedKey, corpus: int) -> None:
    Limit.objects.create(
        team=team,
        daily_tokens=100_000,
        monthly_tokens=1_000_000,
        burst_tokens=50_000,
        tokens_per_minute=50_000,
        max_concurrent_streams=4,
    )
    Limit.objects.create(team=team, api_key=issued_key.api_key, max_tokens=512)
    _chat(issued_key)
    for group in ("day", "model", "key", "kind"):
        report = _call(issued_key, "GET", "/api/v1/usage", query={"group_by": group}).json()
        rows = report["data"]  # the ingestion's embedding, the answer's and the query's
        assert rows and report["total"]["requests"] == sum(row["requests"] for row in rows)
    quota = _call(issued_key, "GET", "/api/v1/quota").json()
    assert {limit["scope"] for limit in quota["limits"]} == {
        "team",
        f"key {issued_key.api_key.prefix}",
    }


def _refused(path: str, method: str, response: httpx.Response) -> bool:
    try:
        schema[path][method].validate_response(response)
    except (Failure, FailureGroup):
        return True
    return False


def _reply(
    method: str, path: str, content: bytes, media_type: str = "application/json"
) -> httpx.Response:
    request = httpx.Request(method, f"http://localhost{path}")
    response = httpx.Response(
        200, headers={"content-type": media_type}, content=content, request=request
    )
    response.elapsed = timedelta(0)
    return response


COMPLETION = (
    b'{"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "small", '
    b'"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, '
    b'"logprobs": null, "finish_reason": "stop"}], '
    b'"usage": {"prompt_tokens": 3, "completion_tokens": 1, '
    b'"total_tokens": 4, "prompt_tokens_details": {"cached_tokens": 0}, '
    b'"completion_tokens_details": {"reasoning_tokens": 0}, "cache_hit": false}, '
    b'"citations": []}'
)


@pytest.mark.parametrize(
    ("broken", "fixed"),
    [
        (b'"prompt_tokens": "3"', b'"prompt_tokens": 3'),
        (b'"finish_reason": "done"', b'"finish_reason": "stop"'),
        (b'"citations": [{"id": 1}]', b'"citations": []'),
        (b'"object": "chat.completion.chunk"', b'"object": "chat.completion"'),
    ],
)
def test_a_completion_that_breaks_the_schema_is_refused(broken: bytes, fixed: bytes) -> None:
    path = "/v1/chat/completions"
    assert not _refused(path, "POST", _reply("POST", path, COMPLETION))
    assert _refused(path, "POST", _reply("POST", path, COMPLETION.replace(fixed, broken)))


@pytest.mark.parametrize(
    ("path", "method", "stream"),
    [
        (
            "/api/v1/messages/{message_id}/events",
            "GET",
            b'id: 1\r\nevent: delta\r\ndata: {"text": 7}\r\n\r\n',
        ),
        (
            "/api/v1/messages/{message_id}/events",
            "GET",
            b'id: 1\r\nevent: usage\r\ndata: {"prompt_tokens": 1}\r\n\r\n',
        ),
        (
            "/v1/chat/completions",
            "POST",
            b'data: {"object": "chat.completion.chunk", "choices": []}\r\n\r\n',
        ),
        ("/v1/chat/completions", "POST", b"data: [NOT DONE]\r\n\r\n"),
    ],
)
def test_an_event_that_breaks_the_schema_is_refused(path: str, method: str, stream: bytes) -> None:
    assert _refused(path, method, _reply(method, path, stream, "text/event-stream"))


def test_the_events_as_sent_pass() -> None:
    events = (
        b'id: 1\r\nevent: message\r\ndata: {"message_id":1,"conversation_id":2,"model":"small"}'
        b'\r\n\r\nid: 2\r\nevent: delta\r\ndata: {"text":"Hi"}\r\n\r\n'
        b'id: 3\r\nevent: done\r\ndata: {"message_id":1,"finish_reason":"stop"}\r\n\r\n'
    )
    path = "/api/v1/messages/{message_id}/events"
    assert not _refused(path, "GET", _reply("GET", path, events, "text/event-stream"))


@pytest.mark.parametrize("conversation_id", [2**63, 13368829789499334656])
def test_an_id_past_the_databases_integer_is_a_404(
    issued_key: IssuedKey, conversation_id: int
) -> None:
    """Found by schemathesis: the history's raw SQL raised OverflowError (a 500) on SQLite
    for a conversation id past 2**63 - 1."""
    response = _call(
        issued_key,
        "POST",
        "/api/v1/conversations/{conversation_id}/messages",
        path_parameters={"conversation_id": conversation_id},
        body={"content": QUESTION},
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
