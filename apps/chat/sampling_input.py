"""OpenAI's sampling fields, with OpenAI's bounds, as both answer surfaces take them.

Each surface's ``InputSerializer`` derives from :class:`SamplingInput`, so the native API
and ``/v1/chat/completions`` check the same fields the same way: a wrong type or range
is a 400 naming the field (``param``); a field no tier here can honour (``n`` above 1)
is a 400 ``unsupported_parameter`` naming it. Whether the model's own server honours the
rest is decided before admission (``routing.models_honouring``). Null is the field left
out, as OpenAI reads it.
"""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.exceptions import InvalidRequest
from apps.core.tags import TAG_HELP, TAG_PATTERN

MAX_STOP = 4
MAX_LOGIT_BIAS = 300
MAX_METADATA = 16
SEED_BOUND = 2**63
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOKEN_ID = re.compile(r"\d{1,9}")


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP},
        ],
        "nullable": True,
        "description": "up to 4 sequences where generation stops",
    }
)
class StopField(serializers.Field):  # type: ignore[type-arg]
    """``stop``: a string or a list of up to four, read as a tuple."""

    def to_internal_value(self, data: Any) -> tuple[str, ...]:
        stops = [data] if isinstance(data, str) else data
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise serializers.ValidationError("a non-empty string or a list of them.")
        if len(stops) > MAX_STOP:
            raise serializers.ValidationError(f"at most {MAX_STOP} sequences.")
        return tuple(stops)

    def to_representation(self, value: Any) -> Any:
        return list(value)


class JsonSchemaInput(serializers.Serializer[dict[str, Any]]):
    name = serializers.RegexField(SCHEMA_NAME)
    description = serializers.CharField(required=False, max_length=4096)
    schema = serializers.DictField(required=False)
    strict = serializers.BooleanField(required=False, allow_null=True)


class ResponseFormatInput(serializers.Serializer[dict[str, Any]]):
    type = serializers.ChoiceField(choices=["text", "json_object", "json_schema"])
    json_schema = JsonSchemaInput(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["type"] == "json_schema" and "json_schema" not in attrs:
            raise serializers.ValidationError({"json_schema": "required with json_schema."})
        return attrs


class SamplingInput(serializers.Serializer[dict[str, Any]]):
    temperature = serializers.FloatField(required=False, allow_null=True, min_value=0, max_value=2)
    top_p = serializers.FloatField(required=False, allow_null=True, min_value=0, max_value=1)
    stop = StopField(required=False, allow_null=True)
    seed = serializers.IntegerField(
        required=False, allow_null=True, min_value=-SEED_BOUND, max_value=SEED_BOUND - 1
    )
    presence_penalty = serializers.FloatField(
        required=False, allow_null=True, min_value=-2, max_value=2
    )
    frequency_penalty = serializers.FloatField(
        required=False, allow_null=True, min_value=-2, max_value=2
    )
    logit_bias = serializers.DictField(
        child=serializers.FloatField(min_value=-100, max_value=100),
        required=False,
        allow_null=True,
        help_text="token id (a string) to bias, -100 to 100; at most 300",
    )
    response_format = ResponseFormatInput(required=False, allow_null=True)
    user = serializers.CharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        max_length=256,
        help_text="your end user, forwarded to servers that take it; changes no output",
    )
    metadata = serializers.DictField(
        child=serializers.CharField(max_length=512, allow_blank=True),
        required=False,
        allow_null=True,
        help_text="up to 16 string pairs (keys up to 64 characters); not used for generation; "
        "`tag`: the purpose tag of the usage (a-z, 0-9, '.', '_', '-', at most 32)",
    )
    n = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=128,
        help_text="only 1: more choices are a 400 unsupported_parameter",
    )
    logprobs = serializers.BooleanField(
        required=False,
        allow_null=True,
        help_text="return each answer token's log probability (OpenAI's logprobs.content)",
    )
    top_logprobs = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=20,
        help_text="and the likeliest tokens at each position; needs logprobs true",
    )

    def validate_logit_bias(self, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None:
            if len(value) > MAX_LOGIT_BIAS:
                raise serializers.ValidationError(f"at most {MAX_LOGIT_BIAS} tokens.")
            if not all(TOKEN_ID.fullmatch(key) for key in value):
                raise serializers.ValidationError("keys are token ids, as strings.")
        return value

    def validate_metadata(self, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if len(value) > MAX_METADATA:
                raise serializers.ValidationError(f"at most {MAX_METADATA} pairs.")
            if any(len(key) > 64 for key in value):
                raise serializers.ValidationError("keys are at most 64 characters.")
            if "tag" in value and not TAG_PATTERN.fullmatch(value["tag"]):
                raise serializers.ValidationError(f"tag: {TAG_HELP}.")
        return value

    def validate_n(self, value: int | None) -> int | None:
        if value is not None and value > 1:
            raise _unsupported("n", "only one choice is generated per request")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if attrs.get("top_logprobs") is not None and not attrs.get("logprobs"):
            raise InvalidRequest(
                "top_logprobs: logprobs must be true when top_logprobs is set.",
                code="invalid_value",
                param="top_logprobs",
            )
        return attrs


def sampling_values(data: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields of ``data`` (validated) as :class:`~.services.AnswerRequest`
    takes them: hashable, in a stable order, left out when not set."""
    values: dict[str, Any] = {
        name: data.get(name)
        for name in (
            "temperature",
            "top_p",
            "stop",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "user",
            "top_logprobs",
        )
    }
    bias = data.get("logit_bias")
    values["logit_bias"] = tuple(sorted(bias.items())) if bias else None
    values["logprobs"] = data.get("logprobs") or None  # false is the default
    response_format = data.get("response_format")
    values["response_format"] = dict(response_format) if response_format else None
    return {name: value for name, value in values.items() if value is not None}


def _unsupported(param: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {why}.", code="unsupported_parameter", param=param)
