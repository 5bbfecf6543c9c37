"""The OpenAPI schema's one place for what every operation shares: the error responses,
and the shape of a ``text/event-stream`` response (:func:`event_stream`).

``AutoSchema`` (``DEFAULT_SCHEMA_CLASS``) adds to each operation the errors it can answer,
all with the one ``Error`` component (see :mod:`apps.core.exceptions`), derived from what
the operation is: 401/403/429 where it needs a key (429: the team's request rate), 400
where it reads a body or a query, 404 where its path names an object, 413/415 where it
reads a body, 406 and 503 (a database or Redis outage) everywhere. A view's
``extend_schema`` names only what is specific to it (a 429 from the token budget, the
inference tier's 502/504); an error status it names without a body gets the ``Error``
body here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from drf_spectacular import openapi
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object, list_hash
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers
from rest_framework.settings import api_settings

ERROR_DESCRIPTIONS = {
    400: "invalid_request_error: the body or a parameter is invalid (invalid_json, "
    "missing_field, invalid_value, …)",
    401: "authentication_error: missing_api_key, invalid_api_key, revoked_api_key, expired_api_key",
    403: "permission_error: scope_missing, no_team",
    404: "not_found_error: no such object in the caller's team",
    406: "invalid_request_error: not_acceptable (no representation for the Accept header)",
    409: "conflict_error",
    413: "invalid_request_error: payload_too_large, file_too_large",
    415: "invalid_request_error: unsupported_media_type, unsupported_file_type",
    422: "invalid_request_error",
    429: "rate_limit_error: rate_limited (the team's requests per second, on every "
    "authenticated operation), with Retry-After",
    502: "upstream_error: inference_unavailable (the inference tier failed)",
    503: "overloaded: database_unavailable, redis_unavailable, queue_full, "
    "rate_limiter_unavailable, index_unavailable (the Milvus engine cannot be reached); "
    "with Retry-After",
    504: "upstream_error: inference_timeout (no token in time)",
}

RETRY_AFTER = {
    "schema": {"type": "integer", "minimum": 1},
    "description": "Seconds to wait before retrying.",
}
RATE_LIMIT_HEADERS = {
    f"x-ratelimit-{name}-{unit}": {"schema": {"type": schema}, "description": description}
    for unit in ("tokens", "streams", "requests")
    for name, schema, description in (
        ("limit", "integer", f"The limit's capacity in {unit}."),
        ("remaining", "integer", f"{unit.capitalize()} available now."),
        ("reset", "string", "When the limit has room again, as seconds: '12s'."),
    )
}
ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}},
    429: {"Retry-After": RETRY_AFTER, **RATE_LIMIT_HEADERS},
    503: {"Retry-After": RETRY_AFTER},
}


EVENTS_KEY = "x-ragtier-events"
"""Marks an :func:`event_stream` schema for :class:`AutoSchema` to build: its events' data
are serializers, resolved to components only when the operation is generated."""

EventData = type[serializers.Serializer[Any]]


def event_stream(
    description: str,
    *,
    events: Mapping[str, EventData] | None = None,
    data: Sequence[EventData] = (),
    sentinel: str | None = None,
) -> OpenApiResponse:
    """A ``text/event-stream`` response, its schema describing one event.

    ``events``: a stream of named events (``event:``, ``id:``), each name with the
    serializer of its JSON ``data``. Otherwise an unnamed stream (the OpenAI wire): each
    ``data`` is JSON in one of ``data``'s serializers, or the ``sentinel`` as is
    (``[DONE]``). The data is declared as JSON (``contentMediaType``) with its
    ``contentSchema``, so a conformance check reads each event's JSON, not a bare string."""
    marker = {EVENTS_KEY: {"events": dict(events or {}), "data": tuple(data), "sentinel": sentinel}}
    return OpenApiResponse(response=marker, description=description)


class ConstantField(serializers.CharField):
    """A string the response always holds as ``value`` (OpenAI's ``object: "list"``,
    ``role: "assistant"``): in the schema an enum of one, named after its component, so
    that the constants of many components never collide in one named enum."""

    def __init__(self, value: str, **kwargs: Any) -> None:
        self.value = value
        super().__init__(**kwargs)


class ErrorDetailSerializer(serializers.Serializer[dict[str, Any]]):
    type = serializers.CharField(help_text="The error's class, e.g. rate_limit_error.")
    code = serializers.CharField(help_text="A stable code, e.g. team_tokens_per_minute.")
    message = serializers.CharField(help_text="What went wrong, for a person.")
    param = serializers.CharField(
        allow_null=True, help_text="The parameter at fault (a dotted path), if any."
    )


class ErrorSerializer(serializers.Serializer[dict[str, Any]]):
    """Every error, on every surface (the OpenAI shape)."""

    error = ErrorDetailSerializer()


class AutoSchema(openapi.AutoSchema):
    def get_serializer_name(self, serializer: serializers.Serializer[Any], direction: Any) -> str:
        """A view's nested ``InputSerializer``/``OutputSerializer``/``FilterSerializer`` is
        named after its view (``SearchApi.InputSerializer``: ``SearchRequest``), so that no
        two views share one component."""
        owner, _, name = type(serializer).__qualname__.rpartition(".")
        if owner.endswith("Api"):
            suffix = {"InputSerializer": "", "OutputSerializer": "Response"}.get(name, name)
            return owner.removesuffix("Api") + suffix
        return str(super().get_serializer_name(serializer, direction))

    def _map_serializer_field(
        self, field: Any, direction: Any, bypass_extensions: bool = False
    ) -> dict[str, Any]:
        """What DRF's fields refuse beyond their types: an empty list where ``allow_empty``
        is off, and NUL characters in text (``ProhibitNullCharactersValidator``). A
        :class:`ConstantField` is its value."""
        if isinstance(field, ConstantField):
            owner = type(field.parent).__name__
            constant: dict[str, Any] = {
                "type": "string",
                "enum": [field.value],
                "x-spec-enum-id": list_hash([(owner, field.value)]),  # its own, per component
            }
            if field.help_text:
                constant["description"] = str(field.help_text)
            return constant
        schema: dict[str, Any] = super()._map_serializer_field(  # type: ignore[no-untyped-call]
            field, direction, bypass_extensions
        )
        if schema.get("type") == "array" and getattr(field, "allow_empty", True) is False:
            schema.setdefault("minItems", 1)
        if isinstance(field, serializers.CharField) and direction == "request":
            schema.setdefault("pattern", "^[^\\u0000]*$")
        return schema

    def map_parsers(self) -> list[Any]:
        """JSON, unless the view names its own parsers (uploads): DRF's multipart parser
        is on by default, but no other body here is meant as a form (lists, objects)."""
        media_types: list[Any] = super().map_parsers()
        # api_settings imports the dotted paths; its stubs type the setting as the strings.
        if self.view.parser_classes == api_settings.DEFAULT_PARSER_CLASSES:  # type: ignore[comparison-overlap]
            return [media_type for media_type in media_types if media_type == "application/json"]
        return media_types

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        responses: dict[str, Any] = operation.setdefault("responses", {})
        for response in responses.values():
            self._with_event_schemas(response)
        for status in self._error_statuses(operation):
            responses.setdefault(str(status), {"description": ERROR_DESCRIPTIONS[status]})
        for code, response in responses.items():
            if int(code) >= 400:
                self._with_error_body(int(code), response)
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def _with_event_schemas(self, response: dict[str, Any]) -> None:
        """An :func:`event_stream` marker replaced by the event schema it describes (a new
        dict: the marker is shared by every generation of the schema)."""
        media = response.get("content", {}).get("text/event-stream")
        marker = media.get("schema", {}).get(EVENTS_KEY) if media else None
        if marker is None:
            return
        if marker["events"]:
            media["schema"] = {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {
                            "event": {"type": "string", "enum": [name]},
                            "id": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                            "data": self._json_data(serializer),
                        },
                        "required": ["event", "id", "data"],
                    }
                    for name, serializer in marker["events"].items()
                ]
            }
            return
        data = self._json_data(*marker["data"])
        sentinel = marker["sentinel"]
        if sentinel is not None:
            json_data = {**data, "not": {"enum": [sentinel]}}
            data = {"oneOf": [{"type": "string", "enum": [sentinel]}, json_data]}
        media["schema"] = {
            "type": "object",
            "properties": {"data": data},
            "required": ["data"],
        }

    def _json_data(self, *shapes: EventData) -> dict[str, Any]:
        """An event's ``data`` line: JSON in (one of) ``shapes``' components."""
        refs = [self.resolve_serializer(shape, "response").ref for shape in shapes]
        return {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": refs[0] if len(refs) == 1 else {"oneOf": refs},
        }

    def _error_statuses(self, operation: dict[str, Any]) -> set[int]:
        statuses = {406, 503}
        locations = {parameter["in"] for parameter in operation.get("parameters", [])}
        reads_body = "requestBody" in operation
        if getattr(self.view, "required_scopes", None):
            statuses |= {401, 403, 429}  # 429: the team's request rate
        if reads_body or "query" in locations or "header" in locations:
            statuses.add(400)
        if "path" in locations:
            statuses.add(404)
        if reads_body:
            statuses |= {413, 415}
        return statuses

    def _with_error_body(self, status: int, response: dict[str, Any]) -> None:
        response.setdefault("description", ERROR_DESCRIPTIONS.get(status, ""))
        if not response.get("content"):
            error = self.resolve_serializer(ErrorSerializer, "response")
            response["content"] = {"application/json": {"schema": error.ref}}
        headers = ERROR_HEADERS.get(status)
        if headers:
            response["headers"] = {**headers, **response.get("headers", {})}


class ApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """``Authorization: Bearer <api key>``."""

    target_class = "apps.accounts.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return dict(
            build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Bearer")  # noqa: S106
        )


def idempotency_key_parameter() -> OpenApiParameter:
    """The ``Idempotency-Key`` request header of the POSTs that create."""
    return OpenApiParameter(
        "Idempotency-Key",
        str,
        OpenApiParameter.HEADER,
        required=False,
        pattern=r"^[\x20-\x7e]{1,255}$",
        description="Retry safely: the same key and body from the same team within 24 h "
        "replays the first result (same id; an answer's events replayed, its tokens "
        "charged once) with the header Idempotent-Replayed: true; the same key with another "
        "body answers 422 idempotency_key_reused; while the first is served, 409 "
        "idempotency_in_progress.",
    )


IDEMPOTENCY_RESPONSES = {
    409: OpenApiResponse(
        description="idempotency_in_progress: the first request with this "
        "Idempotency-Key is still being served"
    ),
    422: OpenApiResponse(
        description="idempotency_key_reused: this Idempotency-Key came with another body"
    ),
}

ANSWER_RESPONSES = {
    429: OpenApiResponse(
        description="key_tokens_per_minute, team_tokens_per_minute, "
        "team_quota_exceeded, key_quota_exceeded, too_many_concurrent_streams; "
        "Retry-After and x-ratelimit-{limit,remaining,reset}-tokens "
        "(-streams for concurrency); nothing embedded or generated"
    ),
    502: OpenApiResponse(description="inference_unavailable: the tier failed"),
    503: OpenApiResponse(
        description="queue_full (no slot at the inference tier within "
        "INFERENCE_QUEUE_TIMEOUT; nothing billed) or rate_limiter_unavailable (Redis "
        "down, failing closed), with Retry-After"
    ),
    504: OpenApiResponse(description="inference_timeout: no token in time"),
}
"""What an answer can meet past validation, on every surface that answers: the token
budget (429), a full queue or the limiter down (503), the inference tier (502, 504)."""
