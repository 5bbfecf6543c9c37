"""Body limits for requests that reach Django without the ASGI guard (WSGI, test client)."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from apps.core.exceptions import error_body
from apps.core.limits import body_limit


class BodySizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit, code = body_limit(request.content_type or "")
        declared = request.META.get("CONTENT_LENGTH") or "0"
        if declared.isdigit() and int(declared) > limit:
            message = f"The request body is larger than the {limit}-byte limit."
            return JsonResponse(
                error_body(type="invalid_request_error", code=code, message=message), status=413
            )
        return self.get_response(request)
