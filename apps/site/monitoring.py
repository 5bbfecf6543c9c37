"""The monitoring endpoints (``/metrics``, ``/readyz``): who may read them, and what
``/metrics`` shows.

They tell an outsider how busy the service is and which dependency is down, so production
keeps them closed to all but a bearer of ``METRICS_TOKEN`` or a client in
``METRICS_ALLOWED_NETWORKS`` (settings in ``config.settings.monitoring``). The metrics
themselves are defined where they are counted (:mod:`apps.usage.metrics`); the collectors
that read state at scrape time live here, above every app they read."""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from apps.core.exceptions import ApplicationError, PermissionDenied, error_body
from apps.usage.selectors import reservations_open

logger = logging.getLogger(__name__)

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


class ReservationsCollector:
    """Open reservations and the tokens they hold, read from the database at scrape time:
    exact whichever process reserved, settled or expired them."""

    def collect(self) -> Iterator[Metric]:
        try:
            held = reservations_open()
        except DatabaseError as exc:  # a scrape still answers with every other metric
            logger.warning("metrics: cannot read reservations: %s", exc)
            return

        count = GaugeMetricFamily(
            "ragtier_reservations_open", "Token reservations not yet settled.", labels=["kind"]
        )
        tokens = GaugeMetricFamily(
            "ragtier_reserved_tokens", "Tokens held by open reservations.", labels=["kind"]
        )
        for kind, (number, reserved) in held.items():
            count.add_metric([kind], number)
            tokens.add_metric([kind], reserved)
        yield count
        yield tokens


def metrics_exposition() -> tuple[bytes, str]:
    """The text exposition of every process's metrics."""
    registry = CollectorRegistry()
    registry.register(ReservationsCollector())
    own = generate_latest(registry)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        aggregated = CollectorRegistry()
        multiprocess.MultiProcessCollector(aggregated)  # type: ignore[no-untyped-call]
        return generate_latest(aggregated) + own, CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY) + own, CONTENT_TYPE_LATEST
