"""Milvus Lite as a server of the run's own, started as ``manage.py runstack`` starts it
(``milvus-lite server`` on loopback), and what a run reads about a process: its memory,
and when it has finished the work a write left it (index_kinds and index_write measure
with this)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.harness.processes import Service, Services, cpu_seconds, free_port


def start_milvus_lite(services: Services, data_dir: Path, *, timeout: float = 60) -> str:
    """``milvus-lite server`` on a free loopback port with its data in ``data_dir``; its
    URI once it listens. ``services.started[-1]`` is its process."""
    port = free_port()
    argv = [sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(data_dir)]
    service = services.start(
        f"milvus-lite-{port}", [*argv, "--host", "127.0.0.1", "--port", str(port)], dict(os.environ)
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise RuntimeError(f"milvus-lite server exited:\n{service.tail()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    service.stop()
    raise RuntimeError(f"milvus-lite server did not listen in {timeout:.0f} s:\n{service.tail()}")


def stop_milvus_lite(service: Service) -> None:
    """Stop the server as Ctrl-C does (it closes its data folder), then as ``stop`` does."""
    if service.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.process.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            service.process.wait(timeout=30)
    service.stop()


def settle(pid: int, *, window: float = 2.0, quiet: float = 0.05, timeout: float = 3600) -> float:
    """Wait until process ``pid`` uses under ``quiet`` CPU seconds in ``window`` seconds;
    the seconds waited. Milvus Lite answers a write once its rows are in memory or flushed
    to files, then compacts segments and builds their indexes in a background thread:
    until that is over, a search meets unindexed segments and shares the CPU with it."""
    started = time.monotonic()
    before = cpu_seconds(pid)
    while time.monotonic() - started < timeout:
        time.sleep(window)
        now = cpu_seconds(pid)
        if now - before < quiet:
            return time.monotonic() - started
        before = now
    raise RuntimeError(f"process {pid} still busy after {timeout:.0f} s")


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` now (``VmRSS``)."""
    return _status_bytes(pid, "VmRSS")


def peak_rss_bytes(pid: int) -> int:
    """The most resident memory ``pid`` has held since it started (``VmHWM``)."""
    return _status_bytes(pid, "VmHWM")


def folder_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


def _status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"no {field} in /proc/{pid}/status")
