"""The wire between the app and the tier broken on purpose (tests/fault_proxy.py): each
fault ends the stream with a clear in-band error (or a retried success), settles the
usage once, and leaves no message ``streaming``."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from apps.chat.models import Message
from apps.usage.models import Limit, Reservation, UsageRecord
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.fake_upstream import FakeUpstream
from tests.fault_proxy import FaultProxy, Mode

pytestmark = pytest.mark.django_db(transaction=True)

FAILURES: dict[Mode, str] = {
    "silent": "inference_timeout",
    "stall": "inference_timeout",
    "reset": "inference_unavailable",
    "huge": "inference_protocol_error",
    "garbage": "inference_unavailable",
}


@pytest.fixture
def proxy(upstream: FakeUpstream, settings: Any) -> Iterator[FaultProxy]:
    fault = FaultProxy(target=upstream.base_url).start()
    settings.INFERENCE_BASE_URL = fault.base_url
    settings.INFERENCE_TIMEOUTS = {"connect": 1.0, "first_token": 1.0, "idle": 1.0, "total": 20.0}
    settings.INFERENCE_RETRY_ATTEMPTS = 4
    yield fault
    fault.stop()


class HealthProbe:
    """``/healthz`` latencies sampled from another thread while a fault plays out."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[float] = []
        self.running = True
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while self.running:
                started = time.perf_counter()
                client.get("/healthz").raise_for_status()
                self.samples.append(time.perf_counter() - started)
                time.sleep(0.05)

    def __enter__(self) -> HealthProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join(timeout=15)


def settled_once(message_id: int) -> UsageRecord:
    record = UsageRecord.objects.get(object_id=str(message_id))
    assert not Reservation.objects.filter(settled_at__isnull=True).exists()
    assert Message.objects.get(pk=message_id).status != Message.Status.STREAMING
    return record


@pytest.mark.parametrize("mode", list(FAILURES))
def test_a_broken_wire_ends_in_band_and_settles(
    proxy: FaultProxy,
    http: httpx.Client,
    asgi_server: str,
    issued_key: Any,
    mode: Mode,
    capsys: pytest.CaptureFixture[str],
) -> None:
    Limit.objects.create(team=issued_key.api_key.team, daily_tokens=1_000_000)
    proxy.mode = mode
    with HealthProbe(asgi_server) as probe:
        frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    names = [f["event"] for f in frames]
    assert names[0] == "message"
    assert names[-3:] == ["error", "usage", "done"], names
    assert frames[-3]["data"]["code"] == FAILURES[mode]
    assert frames[-1]["data"]["finish_reason"] == "error"
    record = settled_once(frames[0]["data"]["message_id"])
    assert record.error_code == FAILURES[mode]
    assert record.total_tokens == frames[-2]["data"]["total_tokens"]
    with capsys.disabled():  # reported, not asserted: the machine is shared and noisy
        p99 = statistics.quantiles(probe.samples, n=100)[98] if len(probe.samples) > 2 else 0
        print(f"\n{mode}: /healthz p99 {p99 * 1000:.0f} ms over {len(probe.samples)} probes")


def test_503_three_times_then_ok_is_a_retried_success(
    proxy: FaultProxy, http: httpx.Client, issued_key: Any
) -> None:
    Limit.objects.create(team=issued_key.api_key.team, daily_tokens=1_000_000)
    proxy.mode, proxy.times = "unavailable", 3
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    names = [f["event"] for f in frames]
    assert "error" not in names
    assert names[-2:] == ["usage", "done"]
    assert "".join(f["data"]["text"] for f in frames if f["event"] == "delta") == "Hello world."
    assert proxy.refused == 3
    record = settled_once(frames[0]["data"]["message_id"])
    assert record.status == UsageRecord.Status.OK
