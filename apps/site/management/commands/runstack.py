from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from apps.site.management.commands.runinference import inference_argv


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


class Command(BaseCommand):
    help = (
        "Run the whole product in the foreground: the ASGI web server, a Celery worker (with "
        "the periodic jobs) and the llama.cpp inference tier. Ctrl-C stops all of them."
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
        commands = {
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
            commands["inference"] = inference_argv(
                host=settings.INFERENCE_HOST,
                port=settings.INFERENCE_PORT,
                n_ctx=settings.INFERENCE_N_CTX,
            )
        environment = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir())}
        processes = {
            name: subprocess.Popen(argv, env=environment)  # noqa: S603
            for name, argv in commands.items()
        }
        self.stdout.write(
            f"ragtier on http://{options['host']}:{options['port']}/ "
            f"({', '.join(processes)}); Ctrl-C stops it"
        )

        def stop(*_: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, stop)
        try:
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
