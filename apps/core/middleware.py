"""Body limits for requests that reach Django without the ASGI guard (WSGI, test client)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase, JsonResponse

from apps.core.exceptions import error_body
from apps.core.limits import body_limit


class BodySizeLimitMiddleware:
    """Sync and async: a sync-only middleware would make Django run the whole chain
    below it (the async answer views included) through thread hops on every request."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        if iscoroutinefunction(self):
            return self._acall(request)
        refusal = _refusal(request)
        return refusal if refusal is not None else self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        refusal = _refusal(request)
        return refusal if refusal is not None else await self.get_response(request)


def _refusal(request: HttpRequest) -> JsonResponse | None:
    limit, code = body_limit(request.content_type or "")
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > limit:
        message = f"The request body is larger than the {limit}-byte limit."
        return JsonResponse(
            error_body(type="invalid_request_error", code=code, message=message), status=413
        )
    return None
