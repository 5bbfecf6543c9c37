from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.site.management.commands.runinference import local_tier_argv


def worker_argv(python: str, *, beat: bool = False, concurrency: int = 1) -> list[str]:
    """The Celery worker of the embedded default (also what tests and benches start).

    The prefork pool with one child, not the solo pool: solo runs each task in the
    worker's own process, where nothing can stop a stage past its time limit (Celery's
    soft and hard limits need a child to interrupt or kill) and a crashing document takes
    the whole worker, beat included, down with it. One child still keeps one copy of the
    embedding model (the parent never loads it: models come from cached accessors, first
    called in the child), and the parent replaces a child that was killed or has grown
    past ``CELERY_WORKER_MAX_MEMORY_MB``, reloading the model (a second or two). The
    on-disk broker and Redis both work with it, as in docker-compose. ``beat`` runs the
    periodic jobs (the sweep of stalled documents, which also refills the dispatcher)
    as part of the worker.
    """
    argv = [
        python,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "--pool=prefork",
        f"--concurrency={concurrency}",
        "--loglevel=INFO",
    ]
    if beat:
        argv += ["-B", "--schedule", str(settings.CELERY_BEAT_SCHEDULE_FILENAME)]
    return argv


def milvus_argv(python: str, *, uri: str, data_dir: Path) -> list[str]:
    """Milvus Lite as a server (``milvus-lite server``) on ``uri``'s port, for the embedded
    default with ``VECTOR_BACKEND=milvus``: web and worker are separate processes, and a
    ``.db`` Milvus Lite belongs to the one process that opened it (it locks its folder), so
    they share this one engine instead. It listens on loopback only.
    """
    address = urlsplit(uri)
    if address.scheme != "http" or address.hostname not in {"127.0.0.1", "localhost"}:
        raise CommandError(
            f"MILVUS_RUN_LOCAL starts milvus-lite server on this machine, but MILVUS_URI is "
            f"{uri!r}: point it at http://127.0.0.1:<port>, or set MILVUS_RUN_LOCAL=false "
            "to use the Milvus it names."
        )
    return [
        python,
        "-m",
        "milvus_lite",
        "server",
        "--data-dir",
        str(data_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(address.port or 19530),
    ]


def milvus_wait(process: subprocess.Popen[bytes], *, port: int, timeout: float = 30.0) -> None:
    """Return once the engine ``milvus_argv`` started listens on ``port``: pymilvus fails at
    once, not after a wait, when nothing listens yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise CommandError(
                f"milvus-lite server exited (status {process.returncode}) before listening on "
                f"127.0.0.1:{port}; is the port taken, or DATA_DIR/milvus held by another?"
            )
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise CommandError(f"milvus-lite server did not listen on 127.0.0.1:{port} in {timeout:.0f} s")


@contextlib.contextmanager
def local_engine() -> Iterator[None]:
    """While a command that needs the engine runs before ``runstack`` does (``setupdemo``
    ingesting the demo corpus), the embedded default's ``milvus-lite server``; nothing
    unless ``VECTOR_BACKEND=milvus`` with ``MILVUS_RUN_LOCAL``."""
    if not (settings.VECTOR_BACKEND == "milvus" and settings.MILVUS_RUN_LOCAL):
        yield
        return
    argv = milvus_argv(
        sys.executable, uri=settings.MILVUS_URI, data_dir=settings.DATA_DIR / "milvus"
    )
    process = subprocess.Popen(argv)  # noqa: S603
    try:
        milvus_wait(process, port=int(argv[-1]))
        yield
    finally:
        process.terminate()  # it writes what it holds and stops (SIGTERM)
        process.wait(timeout=30)


class Command(BaseCommand):
    help = (
        "Run the whole product in the foreground: the ASGI web server, a Celery worker (with "
        "the periodic jobs), the llama.cpp inference tier and, with VECTOR_BACKEND=milvus, "
        "milvus-lite server. Ctrl-C stops all of them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--web-workers", type=int, default=1)

    @staticmethod
    def metrics_dir() -> Path:
        """Where every process of the stack writes its metrics; emptied at each start."""
        folder = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or settings.DATA_DIR / "metrics")
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def handle(self, *args: Any, **options: Any) -> None:
        python = sys.executable
        commands: dict[str, list[str]] = {}
        # First, and listening before the rest start: its clients do not wait for it.
        if settings.VECTOR_BACKEND == "milvus" and settings.MILVUS_RUN_LOCAL:
            commands["milvus"] = milvus_argv(
                python, uri=settings.MILVUS_URI, data_dir=settings.DATA_DIR / "milvus"
            )
        commands |= {
            "web": [
                python,
                "-m",
                "uvicorn",
                "config.asgi:application",
                "--host",
                options["host"],
                "--port",
                str(options["port"]),
                "--workers",
                str(options["web_workers"]),
            ],
        }
        if not settings.CELERY_TASK_ALWAYS_EAGER:
            commands["worker"] = worker_argv(
                python, beat=True, concurrency=settings.CELERY_WORKER_CONCURRENCY
            )
        if settings.INFERENCE_RUN_LOCAL:
            commands["inference"] = local_tier_argv(
                host=settings.INFERENCE_HOST,
                port=settings.INFERENCE_PORT,
                n_ctx=settings.INFERENCE_N_CTX,
            )
        environment = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir())}

        def stop(*_: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, stop)
        processes: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name, argv in commands.items():
                processes[name] = subprocess.Popen(argv, env=environment)  # noqa: S603
                if name == "milvus":
                    milvus_wait(processes[name], port=int(argv[-1]))
            self.stdout.write(
                f"ragtier on http://{options['host']}:{options['port']}/ "
                f"({', '.join(processes)}); Ctrl-C stops it"
            )
            while all(process.poll() is None for process in processes.values()):
                time.sleep(0.5)
            failed = [name for name, process in processes.items() if process.poll() is not None]
            self.stderr.write(f"{', '.join(failed)} exited; stopping the rest")
        except KeyboardInterrupt:
            pass
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes.values():
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
