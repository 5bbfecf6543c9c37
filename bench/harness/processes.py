"""Subprocesses a run starts (the app under uvicorn, a fake or real tier), each in its own
session with its output in a log, and what a run reads about them."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness.environment import REPO_ROOT, service_env

CONTEXT_WINDOW = 2048

# The fake tier in its own process (so this client's threads do not slow it down), with a
# route that returns the request bodies it recorded.
FAKE_UPSTREAM_CODE = """
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fake_upstream import FakeUpstream, Script

port, delay = int(sys.argv[1]), float(sys.argv[2])
upstream = FakeUpstream(script=Script(emit_max_tokens=True, delay=delay))


async def recorded(request):
    return JSONResponse(upstream.requests[-int(request.query_params.get("last", "1")) :])


async def set_delay(request):
    upstream.script.delay = float(request.query_params["seconds"])
    upstream.script.stamp = request.query_params.get("stamp") == "1"
    upstream.script.paced = request.query_params.get("paced") == "1"
    return JSONResponse({"delay": upstream.script.delay, "stamp": upstream.script.stamp})


async def spans(request):
    taken = list(upstream.spans)
    upstream.spans.clear()
    return JSONResponse(taken)


routes = [
    Route("/bench/spans", spans),
    Route("/bench/requests", recorded),
    Route("/bench/delay", set_delay, methods=["POST"]),
]
app = Starlette(routes=[*upstream.app().routes, *routes])
from bench.harness.processes import quiet_gc
quiet_gc()
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def quiet_gc() -> None:
    """The measuring processes (the client, the fake tier) collect garbage as the app's web
    process does (``apps.site.warmup``): startup heap frozen, young generation collected
    every 10,000 allocations. Their own collection pauses would otherwise be counted as
    the app's."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 50, 100)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        # Started in its own session: the group is this service and any child it made.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)


class Services:
    """Subprocesses started by this run; all of them are stopped by ``stop_all``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Service] = []

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Service:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as handle:
            process = subprocess.Popen(
                list(argv),
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        service = Service(name, process, log)
        self.started.append(service)
        return service

    def stop_all(self) -> None:
        for service in reversed(self.started):
            service.stop()


def wait_ready(service: Service, url: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise RuntimeError(
                f"{service.name} exited with {service.process.returncode}:\n{service.tail()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.25)
    raise RuntimeError(
        f"{service.name} not ready at {url} after {timeout:.0f} s:\n{service.tail()}"
    )


def start_app(
    services: Services,
    name: str,
    data_dir: Path,
    inference_base_url: str,
    *,
    context_window: int = CONTEXT_WINDOW,
    **extra: str,
) -> str:
    """Start the app under uvicorn (one worker) on a free port, told the tier's window is
    ``context_window``; ``extra`` goes into its env."""
    port = free_port()
    env = service_env(
        data_dir,
        INFERENCE_BASE_URL=inference_base_url,
        INFERENCE_RUN_LOCAL="false",
        MODEL_SMALL_CONTEXT_WINDOW=str(context_window),
        **extra,
    )
    argv = [sys.executable, "-m", "uvicorn", "config.asgi:application"]
    service = services.start(name, [*argv, "--host", "127.0.0.1", "--port", str(port)], env)
    url = f"http://127.0.0.1:{port}"
    wait_ready(service, f"{url}/healthz", timeout=120)
    return url


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used, all its threads (``/proc/<pid>/task/*/schedstat``:
    nanoseconds on the CPU, not the 10 ms ticks of ``/proc/<pid>/stat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9
