"""Access to the monitoring endpoints (``/metrics``, ``/readyz``): they tell an outsider
how busy the service is and which dependency is down, so production keeps them closed to
all but a bearer of ``METRICS_TOKEN`` or a client in ``METRICS_ALLOWED_NETWORKS``
(settings in ``config.settings.monitoring``)."""

from __future__ import annotations

import functools
import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase, JsonResponse

from apps.core.exceptions import ApplicationError, PermissionDenied, error_body

View = TypeVar("View", bound=Callable[..., Any])


class MonitoringTokenInvalid(ApplicationError):
    status, type, code = 401, "authentication_error", "invalid_metrics_token"


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _from_allowed_network(request: HttpRequest) -> bool:
    networks: list[str] = settings.METRICS_ALLOWED_NETWORKS
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net, strict=False) for net in networks)


def monitoring_authorize(request: HttpRequest) -> None:
    """Let the request through, or raise: 401 without the right token when one is set,
    403 otherwise."""
    token: str = settings.METRICS_TOKEN
    networks: list[str] = settings.METRICS_ALLOWED_NETWORKS
    if not token and not networks:
        if settings.METRICS_OPEN_BY_DEFAULT:
            return
        raise PermissionDenied(
            "Monitoring is closed: set METRICS_TOKEN or METRICS_ALLOWED_NETWORKS.",
            code="monitoring_closed",
        )
    if _from_allowed_network(request):
        return
    if token:
        presented = _bearer(request)
        if presented is None:
            raise MonitoringTokenInvalid(
                "Send the metrics token as 'Authorization: Bearer <token>'.",
                code="missing_metrics_token",
            )
        if hmac.compare_digest(presented.encode(), token.encode()):
            return
        raise MonitoringTokenInvalid("The metrics token is not valid.")
    raise PermissionDenied(
        "Only the networks in METRICS_ALLOWED_NETWORKS may read this.",
        code="monitoring_forbidden",
    )


def _refusal(error: ApplicationError) -> JsonResponse:
    body = error_body(type=error.type, code=error.code, message=error.message)
    response = JsonResponse(body, status=error.status)
    if error.status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


def monitoring_endpoint(view: View) -> View:
    """Guards a sync or async view with :func:`monitoring_authorize`."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            try:
                monitoring_authorize(request)
            except ApplicationError as error:
                return _refusal(error)
            return await cast(Callable[..., Awaitable[HttpResponseBase]], view)(
                request, *args, **kwargs
            )

        return cast(View, async_guarded)

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            monitoring_authorize(request)
        except ApplicationError as error:
            return _refusal(error)
        return view(request, *args, **kwargs)

    return cast(View, guarded)
