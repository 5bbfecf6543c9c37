"""``POST /v1/embeddings``: OpenAI's Embeddings API over the product's embedding model.

The model is the one ingestion and search embed with (all-MiniLM-L6-v2 on the embedded
default), asked for by its own name, which ``/v1/models`` lists beside the chat aliases.
The tokens it reads are the team's, like every embedding token (kind ``embedding``,
operation ``embeddings``).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from django.conf import settings
from django.http import HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.permissions import get_caller
from apps.core.aio import AsyncApiView
from apps.core.exceptions import InvalidRequest
from apps.core.schema import ConstantField
from apps.core.validation import validated
from apps.knowledge.services import EmbeddingBatch, embeddings_create

IDS_REFUSED = (
    "Token-id arrays are not accepted: ids of another tokenizer mean nothing to this model. "
    "Send text (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False)."
)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "minItems": 1,
                "maxItems": settings.EMBEDDINGS_MAX_INPUTS,
            },
        ],
        "description": "The text to embed, or a list of texts (at most "
        f"RAGTIER_EMBEDDINGS_MAX_INPUTS, {settings.EMBEDDINGS_MAX_INPUTS}); each at most "
        "the model's input length in tokens. Token-id arrays are refused "
        "(unsupported_parameter).",
    }
)
class EmbeddingInputField(serializers.Field):  # type: ignore[type-arg]
    """A string or a list of strings, as a list; the caps checked before any is read."""

    def to_internal_value(self, data: Any) -> list[str]:
        texts = [data] if isinstance(data, str) else data
        if not isinstance(texts, list):
            raise InvalidRequest(
                "input must be a string or a list of strings.", code="invalid_value", param="input"
            )
        if not texts:
            raise InvalidRequest("input must not be empty.", code="invalid_value", param="input")
        if len(texts) > settings.EMBEDDINGS_MAX_INPUTS:
            raise InvalidRequest(
                f"{len(texts)} inputs; one request embeds at most "
                f"{settings.EMBEDDINGS_MAX_INPUTS}.",
                code="too_many_inputs",
                param="input",
            )
        for index, text in enumerate(texts):
            _text_check(text, param="input" if isinstance(data, str) else f"input.{index}")
        return texts

    def to_representation(self, value: Any) -> Any:
        return value


def _text_check(text: object, *, param: str) -> None:
    if isinstance(text, int) or (isinstance(text, list) and text and isinstance(text[0], int)):
        raise InvalidRequest(IDS_REFUSED, code="unsupported_parameter", param="input")
    if not isinstance(text, str):
        raise InvalidRequest("Each input must be a string.", code="invalid_value", param=param)
    if not text:
        raise InvalidRequest("An input must not be empty.", code="invalid_value", param=param)
    if len(text) > settings.EMBEDDINGS_MAX_INPUT_CHARS:
        raise InvalidRequest(
            f"An input is {len(text)} characters; at most "
            f"{settings.EMBEDDINGS_MAX_INPUT_CHARS} are read (RAGTIER_EMBEDDINGS_MAX_INPUT_CHARS).",
            code="input_too_large",
            param=param,
        )


@extend_schema_field(
    {
        "oneOf": [
            {"type": "array", "items": {"type": "number"}},
            {"type": "string", "format": "byte"},
        ],
        "description": "The vector: numbers, or with encoding_format base64 its little-endian "
        "float32 bytes in base64.",
    }
)
class EmbeddingVectorField(serializers.Field):  # type: ignore[type-arg]
    def to_representation(self, value: Any) -> Any:
        return value


class EmbeddingOutput(serializers.Serializer[dict[str, Any]]):
    object = ConstantField("embedding")
    index = serializers.IntegerField(min_value=0)
    embedding = EmbeddingVectorField()


class EmbeddingUsageOutput(serializers.Serializer[dict[str, Any]]):
    prompt_tokens = serializers.IntegerField(
        min_value=0, help_text="What the model read, counted with its own tokenizer."
    )
    total_tokens = serializers.IntegerField(min_value=0, help_text="Equal to prompt_tokens.")


class EmbeddingListOutput(serializers.Serializer[dict[str, Any]]):
    object = ConstantField("list")
    data = EmbeddingOutput(many=True, help_text="One per input, in order.")  # type: ignore[assignment]
    model = serializers.CharField()
    usage = EmbeddingUsageOutput()


class EmbeddingsApi(AsyncApiView):
    required_scopes = {"POST": "chat"}

    class InputSerializer(serializers.Serializer[dict[str, Any]]):
        input = EmbeddingInputField()
        model = serializers.CharField(
            max_length=128,
            help_text="The embedding model's name, as /v1/models lists it "
            "(all-MiniLM-L6-v2 on the embedded default).",
        )
        encoding_format = serializers.ChoiceField(choices=["float", "base64"], default="float")
        dimensions = serializers.IntegerField(
            required=False,
            min_value=1,
            help_text="Only the model's own dimension (384 for all-MiniLM-L6-v2); any other "
            "is 400 unsupported_parameter.",
        )
        user = serializers.CharField(
            required=False, allow_blank=True, max_length=512, help_text="Accepted, unused."
        )

    @extend_schema(
        request=InputSerializer,
        responses={
            200: EmbeddingListOutput,
            400: OpenApiResponse(
                description="too_many_inputs, input_too_large, context_length_exceeded (an "
                "input longer than the model reads), too_many_tokens, unsupported_parameter "
                "(dimensions, token-id arrays)"
            ),
            404: OpenApiResponse(description="model_not_found: not the embedding model's name"),
            429: OpenApiResponse(
                description="team_quota_exceeded: the inputs' tokens do not fit the team's or "
                "key's period quotas"
            ),
        },
    )
    async def post(self, request: Request) -> HttpResponseBase:
        """OpenAI's Embeddings: each input's normalised vector from the product's embedding
        model, and the tokens it read, charged to the caller's team."""
        data = validated(self.InputSerializer, request)
        batch = await embeddings_create(
            caller=get_caller(request),
            model=data["model"],
            texts=data["input"],
            dimensions=data.get("dimensions"),
        )
        return Response(embedding_list(batch, encoding=data["encoding_format"]))


def embedding_list(batch: EmbeddingBatch, *, encoding: str) -> dict[str, Any]:
    """``batch`` in OpenAI's shape; base64 is the vector's little-endian float32 bytes."""
    vectors = np.asarray(batch.vectors, dtype="<f4")
    rows: list[Any] = (
        [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors]
        if encoding == "base64"
        else vectors.tolist()
    )
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": row}
            for index, row in enumerate(rows)
        ],
        "model": batch.model,
        "usage": {"prompt_tokens": batch.prompt_tokens, "total_tokens": batch.prompt_tokens},
    }
