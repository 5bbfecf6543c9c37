"""Liveness, readiness, metrics and the about page.

Readiness and metrics answer only whom :mod:`apps.site.monitoring` lets in."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

import inference
from apps.chat.services.registry import model_registry
from apps.chat.services.tier import inference_client
from apps.core.aio import db_call
from apps.site.monitoring import metrics_exposition, monitoring_endpoint

logger = logging.getLogger(__name__)


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. Touches nothing else."""
    return JsonResponse({"status": "ok"})


@require_GET
@monitoring_endpoint
async def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: database, index directory, broker (when one is configured) and the
    inference tier, checked concurrently."""
    names = ["database", "index_dir", "inference"]
    probes = [
        db_call(_check_database)(),
        asyncio.to_thread(_check_index_dir),
        _check_inference(),
    ]
    if not settings.CELERY_TASK_ALWAYS_EAGER:
        names.append("broker")
        probes.append(asyncio.to_thread(_check_broker))
    checks = dict(zip(names, await asyncio.gather(*probes), strict=True))
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503
    )


def _check_database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        logger.warning("readiness: database: %s", exc)
        return f"error: {type(exc).__name__}"
    return "ok"


async def _check_inference() -> str:
    """Every model alias has an upstream that answers its model list (with the alias's API
    key) within the timeout."""
    for entry in model_registry():
        failure: BaseException | None = None
        for upstream in entry.upstreams:
            try:
                async with asyncio.timeout(settings.READINESS_INFERENCE_TIMEOUT):
                    await inference_client(upstream, api_key=entry.api_key).models()
            except (TimeoutError, inference.InferenceError) as exc:
                failure = exc
                continue
            failure = None
            break
        if failure is not None:
            reason = type(failure).__name__
            logger.warning("readiness: inference tier (%s): %s", entry.alias, reason)
            return f"error: {entry.alias}: {reason}"
    return "ok"


def _check_index_dir() -> str:
    root = Path(settings.INDEX_DIR)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"error: {exc.strerror}"
    return "ok" if os.access(root, os.W_OK) else "error: not writable"


def _check_broker() -> str:
    # The configured app: importing the ``config`` package (the settings) made it current.
    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        logger.warning("readiness: broker: %s", exc)
        return f"error: {type(exc).__name__}"
    return "ok"


@require_GET
@monitoring_endpoint
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition, aggregated over the worker processes."""
    body, content_type = metrics_exposition()
    return HttpResponse(body, content_type=content_type)


def home(request: HttpRequest) -> HttpResponse:
    return render(request, "home.html")
