"""The one domain exception root, and the one place that maps errors to the API shape.

Every surface (JSON API, SSE in-band errors, OpenAI-compatible) renders errors through
:func:`error_body`, so the shape ``{"error": {type, code, message, param}}`` is written once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import redis.exceptions
from django import db
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions as drf
from rest_framework.response import Response

import inference
import retrieval

logger = logging.getLogger(__name__)


class ApplicationError(Exception):
    """An error the caller can act on, with a stable ``code`` and an HTTP status."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
        self.headers = dict(headers or {})


class InvalidRequest(ApplicationError):
    pass


class NotFound(ApplicationError):
    status, type, code = 404, "not_found_error", "not_found"


class PermissionDenied(ApplicationError):
    status, type, code = 403, "permission_error", "scope_missing"


class Unauthenticated(ApplicationError):
    """The credentials stopped working while the request ran (e.g. its key was revoked)."""

    status, type, code = 401, "authentication_error", "invalid_api_key"


class IdempotencyInProgress(ApplicationError):
    """Another request with this ``Idempotency-Key`` is still being served."""

    status, type, code = 409, "conflict_error", "idempotency_in_progress"


class IdempotencyKeyReused(ApplicationError):
    """This ``Idempotency-Key`` was first sent with another request body."""

    status, code = 422, "idempotency_key_reused"


class PayloadTooLarge(ApplicationError):
    status, code = 413, "payload_too_large"


class UnsupportedFileType(ApplicationError):
    status, code = 415, "unsupported_file_type"


class UpstreamError(ApplicationError):
    """The inference tier failed: 502 (unavailable, protocol) or 504 (timeout)."""

    type, code = "upstream_error", "inference_unavailable"

    def __init__(self, message: str, *, status: int = 502, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.status = status


class TooManyRequests(ApplicationError):
    """Slow down: a rate this service keeps, or one the inference tier imposes on it."""

    status, type, code = 429, "rate_limit_error", "rate_limited"


DEPENDENCY_RETRY_SECONDS = 2


class Overloaded(ApplicationError):
    """Nothing failed, but the service cannot take this request now: retry later."""

    status, type, code = 503, "overloaded", "queue_full"


def retry_after_header(seconds: float | None) -> dict[str, str] | None:
    """``Retry-After`` in whole seconds, rounded up (never promise too early)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))} if seconds else None


def error_body(*, type: str, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"type": type, "code": code, "message": message, "param": param}}


def error_response(
    status: int,
    *,
    type: str,
    code: str,
    message: str,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    return Response(
        error_body(type=type, code=code, message=message, param=param),
        status=status,
        headers=dict(headers or {}),
        # JSON whatever the negotiated renderer (a client that asked for an event stream
        # gets its error as JSON too, and every renderer here writes JSON).
        content_type="application/json",
    )


def as_application_error(exc: Exception) -> ApplicationError | None:
    """Translate framework and library exceptions into domain errors; None if unknown."""
    if isinstance(exc, ApplicationError):
        return exc
    for translate in (_dependency_error, _library_error, _framework_error):
        error = translate(exc)
        if error is not None:
            return error
    return None


def _dependency_error(exc: Exception) -> ApplicationError | None:
    """The database or Redis is unreachable, restarting or full: retry shortly."""
    match exc:
        case db.OperationalError() | db.InterfaceError():
            return Overloaded(
                "The database is unavailable; retry shortly.",
                code="database_unavailable",
                headers=retry_after_header(DEPENDENCY_RETRY_SECONDS),
            )
        case redis.exceptions.ConnectionError() | redis.exceptions.TimeoutError():
            return Overloaded(
                "Redis is unavailable; retry shortly.",
                code="redis_unavailable",
                headers=retry_after_header(DEPENDENCY_RETRY_SECONDS),
            )
    return None


def _library_error(exc: Exception) -> ApplicationError | None:
    """What :mod:`inference` and :mod:`retrieval` raise, by the status each carries."""
    match exc:
        case inference.ContextLengthExceeded():
            return InvalidRequest(
                _inference_message(exc), code="context_length_exceeded", param="messages"
            )
        case inference.InferenceError() if exc.status == 400:  # the tier refused the request
            return InvalidRequest(_inference_message(exc), code=exc.code)
        case inference.InferenceError() if exc.status == 429:
            return TooManyRequests(
                _inference_message(exc), code=exc.code, headers=retry_after_header(exc.retry_after)
            )
        case inference.InferenceError() if exc.status == 503:
            return Overloaded(
                _inference_message(exc), code=exc.code, headers=retry_after_header(exc.retry_after)
            )
        case inference.InferenceError():
            return UpstreamError(
                _inference_message(exc),
                code=exc.code,
                status=exc.status,
                headers=retry_after_header(exc.retry_after),
            )
        case retrieval.DocumentTooLarge():
            return PayloadTooLarge(str(exc), code=exc.code)
        case retrieval.UnsupportedDocument():
            return UnsupportedFileType(str(exc))
    return None


def _framework_error(exc: Exception) -> ApplicationError | None:
    """Django's and DRF's own exceptions, in the API's codes."""
    match exc:
        case RequestDataTooBig():
            return PayloadTooLarge("The request body is larger than this endpoint accepts.")
        case drf.ParseError():
            return InvalidRequest(f"The body is not valid JSON: {exc.detail}", code="invalid_json")
        case drf.ValidationError():
            return _validation_error(exc.detail)
        case drf.NotAuthenticated():
            return _auth_error(
                "missing_api_key", "Send an API key as 'Authorization: Bearer <key>'."
            )
        case drf.AuthenticationFailed():
            return _auth_error(_code_of(exc, "invalid_api_key"), str(exc.detail))
        case drf.PermissionDenied() | DjangoPermissionDenied():
            detail = getattr(exc, "detail", "You may not do this.")
            return PermissionDenied(str(detail), code=_code_of(exc, "scope_missing"))
        case drf.NotFound() | Http404():
            return NotFound("No such object.")
        case drf.MethodNotAllowed():
            return _with_status(InvalidRequest(str(exc.detail), code="method_not_allowed"), 405)
        case drf.UnsupportedMediaType():
            return UnsupportedFileType(str(exc.detail), code="unsupported_media_type")
        case drf.NotAcceptable():
            return _with_status(InvalidRequest(str(exc.detail), code="not_acceptable"), 406)
        case drf.Throttled():
            return TooManyRequests(str(exc.detail), headers=retry_after_header(exc.wait))  # type: ignore[attr-defined]
    return None


def _with_status(error: ApplicationError, status: int) -> ApplicationError:
    error.status = status
    return error


def _inference_message(exc: inference.InferenceError) -> str:
    """What a caller reads of an inference failure: the alias that failed and the kind of
    failure, never the upstream's host or address (the ledger and the log keep those) nor
    what it streamed (:mod:`inference` words its own messages)."""
    return f"Model {exc.alias!r}: {exc}" if exc.alias else str(exc)


def mid_stream_error(exc: Exception) -> ApplicationError:
    """What a stream says in-band when ``exc`` stops it after its first byte."""
    error = as_application_error(exc)
    if error is None:
        error = ApplicationError("The server failed; it has been logged.", code="internal_error")
        error.status, error.type = 500, "server_error"
    return error


def _auth_error(code: str, message: str) -> ApplicationError:
    error = ApplicationError(message, code=code, headers={"WWW-Authenticate": "Bearer"})
    error.status, error.type = 401, "authentication_error"
    return error


def _code_of(exc: drf.APIException | Exception, default: str) -> str:
    detail = getattr(exc, "detail", None)
    code = getattr(detail, "code", None)
    generic = {"not_authenticated", "authentication_failed", "permission_denied", "error"}
    return code if isinstance(code, str) and code not in generic else default


def _validation_error(detail: Any, path: str = "") -> ApplicationError:
    """The first field error, with its dotted path as ``param``."""
    if isinstance(detail, Mapping):
        field, inner = next(iter(detail.items()))
        name = path if field == "non_field_errors" else f"{path}.{field}" if path else str(field)
        return _validation_error(inner, name)
    if isinstance(detail, list) and detail:
        return _validation_error(detail[0], path)
    code = getattr(detail, "code", "invalid")
    label = f"{path}: " if path else ""
    if code == "required":
        return InvalidRequest(
            f"{label}this field is required.", code="missing_field", param=path or None
        )
    return InvalidRequest(f"{label}{detail}", code="invalid_value", param=path or None)


def api_exception_handler(exc: Exception, context: Mapping[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every error in the API's one shape."""
    error = as_application_error(exc)
    if error is None:
        return None  # let Django's 500 handler (also this shape) take it
    return error_response(
        error.status,
        type=error.type,
        code=error.code,
        message=error.message,
        param=error.param,
        headers=error.headers,
    )


# Django's handler400/403/404/500 (named in config/urls.py): errors raised outside DRF, in
# the same shape.
def _error(status: int, *, type: str, code: str, message: str) -> JsonResponse:
    return JsonResponse(error_body(type=type, code=code, message=message), status=status)


def bad_request(request: HttpRequest, exception: Exception) -> JsonResponse:
    return _error(
        400, type="invalid_request_error", code="bad_request", message="The request is malformed."
    )


def permission_denied(request: HttpRequest, exception: Exception) -> JsonResponse:
    return _error(
        403, type="permission_error", code="permission_denied", message="You may not do this."
    )


def not_found(request: HttpRequest, exception: Exception) -> JsonResponse:
    return _error(404, type="not_found_error", code="not_found", message="No such object.")


def server_error(request: HttpRequest) -> JsonResponse:
    return _error(
        500,
        type="server_error",
        code="internal_error",
        message="The server failed; it has been logged.",
    )
