"""/metrics in Prometheus format, counting what the answers did."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from config.env import BASE_DIR
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def sample(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_ttft_histogram_counts_every_answer(
    upstream: FakeUpstream, http: httpx.Client, asgi_server: str
) -> None:
    before = httpx.get(f"{asgi_server}/metrics").text
    for _ in range(3):
        ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    upstream.script.fail_status, upstream.script.fail_times = 503, 99
    http.post(
        f"/api/v1/conversations/{conversation_for(http)}/messages",
        json={"content": "Hi", "top_k": 0},
    )
    response = httpx.get(f"{asgi_server}/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    after = response.text
    ttft = 'ragtier_ttft_seconds_count{model="small"}'
    assert sample(after, ttft) - sample(before, ttft) == 3  # the failed one had no token
    output = '{direction="output",kind="chat",model="small"}'
    assert (
        sample(after, "ragtier_tokens_total", output)
        - sample(before, "ragtier_tokens_total", output)
        == 9
    )
    errors = '{code="inference_unavailable"}'
    assert (
        sample(after, "ragtier_upstream_errors_total", errors)
        - sample(before, "ragtier_upstream_errors_total", errors)
        == 1
    )
    assert sample(after, "ragtier_generations_in_flight") == 0
    assert "ragtier_retrieval_seconds_bucket" in after


def test_metrics_aggregate_across_processes(tmp_path: object) -> None:
    """Two processes write, a third serves the sum (the multiprocess mode runstack uses)."""
    env = {
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "PATH": "/usr/bin:/bin",
    }
    write = (
        "import django; django.setup(); from apps.usage import metrics; "
        "metrics.TOKENS.labels('chat', 'small', 'output').inc(5)"
    )
    for _ in range(2):
        subprocess.run(
            [sys.executable, "-c", write], cwd=BASE_DIR, env=env, check=True, timeout=120
        )
    read = (
        "import django; django.setup(); from apps.site.monitoring import metrics_exposition; "
        "print(metrics_exposition()[0].decode())"
    )
    out = subprocess.run(
        [sys.executable, "-c", read],
        cwd=BASE_DIR,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert (
        sample(out, "ragtier_tokens_total", '{direction="output",kind="chat",model="small"}') == 10
    )
