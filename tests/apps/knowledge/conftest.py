"""Real Celery worker processes over a real Redis broker, for the integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import pools as kombu_pools

from apps.site.management.commands.runstack import worker_argv
from config.celery import app as celery_app
from config.env import BASE_DIR
from tests.conftest import database_url

BROKER = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/15"


def reset_connections() -> None:
    """Drop pooled broker connections so the next send uses the current broker URL.

    kombu's process-wide producer pools too: they are keyed by broker URL, so the next
    test on the same broker would otherwise get a pool over connections closed here.
    """
    if celery_app._pool is not None:
        celery_app._pool.force_close_all()
    celery_app._pool = None
    celery_app.amqp._producer_pool = None
    kombu_pools.reset()


@pytest.fixture
def broker(settings: Any) -> Iterator[str]:
    client = redis.Redis.from_url(BROKER, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {BROKER}")
    client.flushdb()
    conf = celery_app.conf
    saved = (conf.task_always_eager, conf.broker_url, conf.broker_transport_options)
    conf.task_always_eager, conf.broker_url = False, BROKER
    conf.broker_transport_options = {"visibility_timeout": 3600}
    reset_connections()
    try:
        yield BROKER
    finally:
        conf.task_always_eager, conf.broker_url, conf.broker_transport_options = saved
        reset_connections()
        client.flushdb()


@dataclass
class Worker:
    """A Celery worker (prefork, one child, as ``runstack`` starts it) in its own session."""

    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(repr=False)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker and its pool children at once: no warm shutdown, no acks."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""


@pytest.fixture
def start_worker(broker: str, settings: Any, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start workers on this test's database, folders and broker: ``start_worker(**env)``.

    They run ``tests.apps.knowledge.worker_settings``, so documents can carry the faults of
    ``tests.apps.knowledge.sabotage``; every parse is logged to ``tmp_path/sabotage.log``.
    """
    workers: list[Worker] = []

    def start(**extra: str) -> Worker:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.apps.knowledge.worker_settings",
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": broker,
            "CELERY_TASK_ALWAYS_EAGER": "false",
            # The worker must see this test's index and upload folders.
            "RAGTIER_TEST_DATA_DIR": str(settings.INDEX_DIR.parent),
            "EMBEDDER_BACKEND": "retrieval.embedders.FakeEmbedder",
            "HF_HUB_OFFLINE": "1",
            "SABOTAGE_LOG": str(tmp_path / "sabotage.log"),
            **extra,
        }
        log = tmp_path / f"worker-{len(workers)}.log"
        argv = [*worker_argv(sys.executable), "--without-gossip", "--without-mingle"]
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv,
                cwd=BASE_DIR,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        workers.append(Worker(process, log, env))
        return workers[-1]

    try:
        yield start
    finally:
        for worker in workers:
            if worker.alive():
                worker.process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.process.wait(timeout=20)
            worker.kill()


def wait_for(
    condition: Callable[[], bool], *, worker: Worker, timeout: float = 120, what: str = ""
) -> None:
    """Poll ``condition`` until it holds; fail with the worker's log if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if not worker.alive():
            pytest.fail(f"the worker exited waiting for {what}:\n{worker.output()}")
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout} s waiting for {what}; worker said:\n{worker.output()}")


@pytest.fixture
def milvus(settings: Any, milvus_lite: str) -> Iterator[None]:
    """Collections made in the test keep their index in Milvus Lite (this process),
    dropped after it."""
    from apps.knowledge.backends.milvus import engine

    settings.VECTOR_BACKEND, settings.MILVUS_URI = "milvus", milvus_lite
    yield
    settings.MILVUS_URI = milvus_lite  # a test may have pointed it elsewhere
    engine().drop()
