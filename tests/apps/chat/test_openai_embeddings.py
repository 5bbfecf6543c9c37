"""``POST /v1/embeddings``: OpenAI's shape, exact tokens, the caps before any work, the
team's ledger, and the ``openai`` SDK unmodified; the fake embedder, and once the real
MiniLM."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import openai
import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey
from apps.knowledge.services import embedder
from apps.knowledge.services.embeddings import _embed
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord
from retrieval import Embeddings, FakeEmbedder
from tests.apps.accounts.test_auth import error_of

pytestmark = pytest.mark.django_db(transaction=True)  # the view embeds on the pool

URL = "/v1/embeddings"
MODEL = "fake-embedder"


def embed(api: APIClient, **body: Any) -> Any:
    return api.post(URL, {"model": MODEL, **body}, format="json")


@pytest.fixture
def no_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Embedding fails the test: what is refused must be refused before the model runs."""
    monkeypatch.setattr(embedder(), "embed", lambda texts: pytest.fail("embedded"))


def test_a_string_in_openais_shape_with_its_exact_tokens(api: APIClient) -> None:
    response = embed(api, input="How are API keys stored?")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0)]
    vector = np.asarray(body["data"][0]["embedding"], dtype=np.float32)
    expected = embedder().embed(["How are API keys stored?"]).vectors[0]
    assert vector.shape == (384,) and np.array_equal(vector, expected)
    tokens = embedder().count_embedding_tokens(["How are API keys stored?"])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_a_list_keeps_its_order_and_counts_every_input(api: APIClient, settings: Any) -> None:
    settings.EMBED_BATCH_SIZE = 2  # three slices: the order survives them
    texts = ["alpha", "beta gamma", "delta", "epsilon zeta eta", "theta"]
    body = embed(api, input=texts).json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3, 4]
    vectors = np.asarray([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert np.array_equal(vectors, embedder().embed(texts).vectors)
    assert body["usage"]["prompt_tokens"] == embedder().count_embedding_tokens(texts)


def test_base64_is_the_little_endian_float32_vector(api: APIClient) -> None:
    texts = ["soup of the day", "fans"]
    floats = embed(api, input=texts).json()["data"]
    coded = embed(api, input=texts, encoding_format="base64").json()["data"]
    for plain, packed in zip(floats, coded, strict=True):
        decoded = np.frombuffer(base64.b64decode(packed["embedding"]), dtype="<f4")
        assert np.array_equal(decoded, np.asarray(plain["embedding"], dtype=np.float32))


def test_dimensions_only_the_models_own(api: APIClient) -> None:
    assert embed(api, input="x", dimensions=384).status_code == 200
    refused = embed(api, input="x", dimensions=256)
    assert refused.status_code == 400
    assert (error_of(refused)["code"], error_of(refused)["param"]) == (
        "unsupported_parameter",
        "dimensions",
    )


def test_another_models_name_is_model_not_found(api: APIClient, no_compute: None) -> None:
    for name in ("small", "text-embedding-3-small"):
        response = embed(api, input="x", model=name)
        assert response.status_code == 404
        assert (error_of(response)["code"], error_of(response)["param"]) == (
            "model_not_found",
            "model",
        )


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": [[1, 2, 3]]}, "unsupported_parameter", "input"),
        ({"input": [5, 6]}, "unsupported_parameter", "input"),
        ({"input": ""}, "invalid_value", "input"),
        ({"input": ["a", ""]}, "invalid_value", "input.1"),
        ({"input": []}, "invalid_value", "input"),
        ({"input": ["a", {"text": "b"}]}, "invalid_value", "input.1"),
        ({"input": {"text": "b"}}, "invalid_value", "input"),
        ({}, "missing_field", "input"),
        ({"input": "x", "encoding_format": "int8"}, "invalid_value", "encoding_format"),
        ({"input": "x", "dimensions": 0}, "invalid_value", "dimensions"),
    ],
)
def test_malformed_input_is_a_400_naming_the_field(
    api: APIClient, no_compute: None, body: dict[str, Any], code: str, param: str
) -> None:
    response = embed(api, **body)
    assert response.status_code == 400, response.content
    assert (error_of(response)["code"], error_of(response)["param"]) == (code, param)
    assert not UsageRecord.objects.exists()


def test_the_caps_answer_400_before_any_work(
    api: APIClient, settings: Any, no_compute: None
) -> None:
    settings.EMBEDDINGS_MAX_INPUTS = 3
    too_many = embed(api, input=["a", "b", "c", "d"])
    assert (too_many.status_code, error_of(too_many)["code"]) == (400, "too_many_inputs")
    settings.EMBEDDINGS_MAX_INPUT_CHARS = 10
    too_large = embed(api, input=["short", "far more than ten"])
    assert (error_of(too_large)["code"], error_of(too_large)["param"]) == (
        "input_too_large",
        "input.1",
    )
    settings.EMBEDDINGS_MAX_INPUT_CHARS = 100_000
    # Past the model's window (the fake reads 256 tokens, [CLS] and [SEP] included):
    # refused, as OpenAI does, never truncated.
    longest = " ".join(["w"] * 254)
    assert embedder().count_embedding_tokens([longest]) == 256
    over = embed(api, input=["fine", longest + " w"])
    assert (over.status_code, error_of(over)["code"], error_of(over)["param"]) == (
        400,
        "context_length_exceeded",
        "input.1",
    )
    settings.EMBEDDINGS_MAX_TOKENS = 5
    total = embed(api, input=["one two", "three four"])  # 4 + 4 tokens
    assert (total.status_code, error_of(total)["code"]) == (400, "too_many_tokens")
    assert not UsageRecord.objects.exists()
    assert not Reservation.objects.exists()


def test_the_longest_input_the_model_reads_is_embedded(api: APIClient) -> None:
    longest = " ".join(["w"] * 254)
    response = embed(api, input=longest)
    assert response.status_code == 200
    assert response.json()["usage"]["prompt_tokens"] == 256


def test_charged_to_the_team_through_a_reservation(
    api: APIClient, team: Team, issued_key: IssuedKey, limiter_store: str
) -> None:
    Limit.objects.create(team=team, daily_tokens=1_000)
    texts = ["How are API keys stored?", "hashed"]
    body = embed(api, input=texts, user="end-user-7").json()
    record = UsageRecord.objects.get()
    assert (record.kind, record.operation, record.model) == ("embedding", "embeddings", MODEL)
    assert record.team == team and record.api_key == issued_key.api_key
    assert record.prompt_tokens == record.total_tokens == body["usage"]["prompt_tokens"]
    assert record.prompt_tokens == embedder().count_embedding_tokens(texts)
    assert QuotaCounter.objects.get().used == record.prompt_tokens
    assert Reservation.objects.get().settled_at is not None


def test_a_team_past_its_quota_gets_a_429_and_no_compute(
    api: APIClient, team: Team, no_compute: None, limiter_store: str
) -> None:
    Limit.objects.create(team=team, daily_tokens=5)
    response = embed(api, input=["one two three", "four five six"])
    assert response.status_code == 429
    assert error_of(response)["code"] == "team_quota_exceeded"
    assert int(response.headers["Retry-After"]) >= 1
    assert "x-ratelimit-remaining-tokens" in response.headers
    assert not UsageRecord.objects.exists()


def test_a_failed_embedding_costs_nothing(
    api: APIClient, team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    Limit.objects.create(team=team, daily_tokens=1_000)

    def broken(texts: Sequence[str]) -> Embeddings:
        raise RuntimeError("the model broke")

    monkeypatch.setattr(embedder(), "embed", broken)
    with pytest.raises(RuntimeError):  # the test client re-raises what the server logs
        embed(api, input="x")
    assert not UsageRecord.objects.exists()
    assert Reservation.objects.get().settled_at is not None
    assert QuotaCounter.objects.get().used == 0


def test_the_key_needs_the_chat_scope(
    api_as: Any, team: Team, settings: Any, no_compute: None
) -> None:
    response = api_as(team, scopes=["read"]).post(
        URL, {"model": MODEL, "input": "x"}, format="json"
    )
    assert (response.status_code, error_of(response)["code"]) == (403, "scope_missing")


def test_the_request_rate_applies(api: APIClient, team: Team) -> None:
    Limit.objects.create(team=team, requests_per_second=1, request_burst=1)
    assert embed(api, input="x").status_code == 200
    refused = embed(api, input="x")
    assert (refused.status_code, error_of(refused)["code"]) == (429, "rate_limited")


def test_models_lists_the_embedding_model(api: APIClient) -> None:
    listed = api.get("/v1/models").json()["data"]
    assert {"id": MODEL, "object": "model", "created": 0, "owned_by": "ragtier"} in listed
    assert {"small", "large", "auto"} <= {m["id"] for m in listed}


async def test_batches_take_turns_at_the_model(settings: Any) -> None:
    """One slot, one text a slice: a second batch's slices alternate with the first's
    rather than wait for it whole."""
    settings.EMBEDDINGS_CONCURRENCY, settings.EMBED_BATCH_SIZE = 1, 1
    order: list[str] = []
    lock = threading.Lock()

    class Recording(FakeEmbedder):
        def embed(self, texts: Sequence[str]) -> Embeddings:
            with lock:
                order.extend(texts)
            return super().embed(texts)

    model = Recording()
    first = asyncio.create_task(_embed(model, ["a1", "a2", "a3", "a4"]))
    await asyncio.sleep(0)  # the first batch holds the slot
    second = asyncio.create_task(_embed(model, ["b1", "b2"]))
    (vectors, read), _ = await asyncio.gather(first, second)
    assert order == ["a1", "b1", "a2", "b2", "a3", "a4"]
    assert vectors.shape == (4, 384) and read == 12


# The official SDK, unmodified, against the running app.


def test_the_openai_sdk_embeds_a_string_a_list_and_base64(sdk: openai.OpenAI) -> None:
    one = sdk.embeddings.create(model=MODEL, input="How are API keys stored?")
    expected = embedder().embed(["How are API keys stored?"]).vectors[0]
    assert np.allclose(one.data[0].embedding, expected)
    assert one.usage.prompt_tokens == one.usage.total_tokens == 8
    many = sdk.embeddings.create(model=MODEL, input=["soup", "fans"], encoding_format="float")
    assert [d.index for d in many.data] == [0, 1]
    assert np.allclose(many.data[1].embedding, embedder().embed(["fans"]).vectors[0])
    packed = sdk.embeddings.create(model=MODEL, input=["soup"], encoding_format="base64")
    raw: Any = packed.data[0].embedding
    decoded = np.frombuffer(base64.b64decode(raw), dtype="<f4") if isinstance(raw, str) else raw
    assert np.array_equal(
        np.asarray(decoded, dtype=np.float32), embedder().embed(["soup"]).vectors[0]
    )
    assert [m.id for m in sdk.models.list()][-1] == MODEL
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model="text-embedding-3-small", input="x")
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model=MODEL, input="x", dimensions=8)
    assert refused.value.code == "unsupported_parameter"


@pytest.mark.integration
def test_the_real_minilm(api: APIClient, real_embedder: None) -> None:
    from apps.knowledge.services import embedding_model_name

    name = embedding_model_name()
    assert name == "all-MiniLM-L6-v2"
    texts = ["How are API keys stored?", "API keys are stored hashed.", "The soup is hot."]
    response = api.post(URL, {"model": name, "input": texts}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    vectors = np.asarray([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]  # it means something
    assert body["usage"]["prompt_tokens"] == embedder().count_embedding_tokens(texts)
    assert UsageRecord.objects.get().prompt_tokens == body["usage"]["prompt_tokens"]
    too_long = api.post(URL, {"model": name, "input": "word " * 300}, format="json")
    assert error_of(too_long)["code"] == "context_length_exceeded"
    listed = {m["id"] for m in api.get("/v1/models").json()["data"]}
    assert name in listed
