"""/healthz answers; /metrics and /readyz: open on the embedded default, else only to a
bearer of METRICS_TOKEN or a client in METRICS_ALLOWED_NETWORKS; readiness includes the
inference tier, reached with the app's INFERENCE_API_KEY."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db

ENDPOINTS = ["/metrics", "/readyz"]


@pytest.fixture
def closed(settings: Any, upstream: FakeUpstream) -> Any:
    """Production's default: neither a token nor a network set, so nothing is let in."""
    settings.METRICS_OPEN_BY_DEFAULT = False
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_NETWORKS = []
    return settings


def test_health_and_readiness(client: Client, upstream: FakeUpstream) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "index_dir": "ok", "inference": "ok"}


def refusal(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_open_on_the_embedded_default(path: str, upstream: FakeUpstream) -> None:
    assert Client().get(path).status_code == 200


@pytest.mark.parametrize("path", ENDPOINTS)
def test_closed_in_production_without_a_token_or_network(path: str, closed: Any) -> None:
    assert refusal(Client().get(path)) == (403, "monitoring_closed")


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_bearer_token_opens_them(path: str, closed: Any) -> None:
    closed.METRICS_TOKEN = "s3cret-metrics-token"
    assert Client().get(path, HTTP_AUTHORIZATION="Bearer s3cret-metrics-token").status_code == 200
    missing = Client().get(path)
    assert refusal(missing) == (401, "missing_metrics_token")
    assert missing["WWW-Authenticate"] == "Bearer"
    wrong = Client().get(path, HTTP_AUTHORIZATION="Bearer s3cret-metrics-tokeN")
    assert refusal(wrong) == (401, "invalid_metrics_token")


@pytest.mark.parametrize("path", ENDPOINTS)
def test_an_allowed_network_opens_them(path: str, closed: Any) -> None:
    closed.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8", "fd00::/8"]
    assert Client(REMOTE_ADDR="10.1.2.3").get(path).status_code == 200
    assert Client(REMOTE_ADDR="fd00::1").get(path).status_code == 200
    assert refusal(Client(REMOTE_ADDR="192.0.2.7").get(path)) == (403, "monitoring_forbidden")
    # With a token set too, either one is enough.
    closed.METRICS_TOKEN = "t0ken"
    assert Client(REMOTE_ADDR="10.9.9.9").get(path).status_code == 200
    outside = Client(REMOTE_ADDR="192.0.2.7")
    assert outside.get(path, HTTP_AUTHORIZATION="Bearer t0ken").status_code == 200
    assert refusal(outside.get(path)) == (401, "missing_metrics_token")


def test_a_malformed_network_fails_the_system_check(settings: Any) -> None:
    from apps.core.checks import monitoring_networks_check

    settings.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8", "10.0.0.300/32"]
    errors = monitoring_networks_check(None)
    assert [error.id for error in errors] == ["ragtier.E010"]
    assert "10.0.0.300/32" in errors[0].msg


def test_readiness_checks_the_inference_tier_with_the_apps_key(
    settings: Any, upstream: FakeUpstream
) -> None:
    upstream.script.api_key = "tier-key"
    settings.INFERENCE_API_KEY = "wrong"
    refused = Client().get("/readyz")
    assert refused.status_code == 503
    assert refused.json()["status"] == "unavailable"
    assert refused.json()["checks"]["inference"].startswith("error: ")
    assert refused.json()["checks"]["database"] == "ok"

    settings.INFERENCE_API_KEY = "tier-key"
    ready = Client().get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"]["inference"] == "ok"


def test_readiness_fails_when_the_tier_is_unreachable(settings: Any, db: None) -> None:
    settings.INFERENCE_BASE_URL = "http://127.0.0.1:9/v1"  # discard port: nothing listens
    settings.INFERENCE_RETRY_ATTEMPTS = 1
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["inference"].startswith("error: ")


def test_the_embedded_tier_requires_the_apps_key_when_one_is_set(settings: Any) -> None:
    from apps.site.management.commands.runinference import inference_argv

    settings.INFERENCE_API_KEY = ""
    assert "--api_key" not in inference_argv(host="127.0.0.1", port=8080, n_ctx=512)
    settings.INFERENCE_API_KEY = "tier-key"
    argv = inference_argv(host="127.0.0.1", port=8080, n_ctx=512)
    assert argv[argv.index("--api_key") + 1] == "tier-key"
