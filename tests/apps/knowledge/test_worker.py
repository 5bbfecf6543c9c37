"""One ingestion end to end through a real Celery worker process over a real Redis broker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from rest_framework.test import APIClient

from apps.knowledge.models import Document
from apps.usage.models import UsageRecord
from config.celery import app as celery_app
from config.env import BASE_DIR
from tests.conftest import database_url, stop_process

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BROKER = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/15"


def reset_connections() -> None:
    """Drop pooled broker connections so the next send uses the current broker URL."""
    if celery_app._pool is not None:
        celery_app._pool.force_close_all()
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


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


@pytest.fixture
def worker(broker: str, settings: Any) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": broker,
        "CELERY_TASK_ALWAYS_EAGER": "false",
        # The worker must see this test's index and upload folders.
        "RAGTIER_TEST_DATA_DIR": str(settings.INDEX_DIR.parent),
        "EMBEDDER_BACKEND": "retrieval.embedders.SentenceTransformerEmbedder",
        "HF_HUB_OFFLINE": "1",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--pool=solo",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        yield process
    finally:
        stop_process(process)


def test_a_real_worker_ingests_an_upload(
    worker: subprocess.Popen[bytes], api: APIClient, settings: Any, real_embedder: None
) -> None:
    created = api.post("/api/v1/collections", {"name": "handbook"}, format="json").json()
    response = api.post(
        f"/api/v1/collections/{created['id']}/documents",
        {"title": "Kitchen", "text": "The spare key to the pantry hangs behind the blue door."},
        format="json",
    )
    assert (response.status_code, response.json()["status"]) == (202, "queued")
    document_id = response.json()["id"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status = Document.objects.get(pk=document_id).status
        if status in ("indexed", "failed") or worker.poll() is not None:
            break
        time.sleep(0.5)
    document = Document.objects.get(pk=document_id)
    if document.status != "indexed":
        worker.terminate()
        output = worker.stdout.read().decode(errors="replace") if worker.stdout else ""
        pytest.fail(
            f"document {document.status} {document.error!r}; worker said:\n{output[-4000:]}"
        )
    assert document.chunk_count == 1 and document.progress == 100
    usage = UsageRecord.objects.get(operation="ingest", object_id=str(document_id))
    assert usage.prompt_tokens == document.embedding_tokens > 0
    hit = api.post("/api/v1/search", {"query": "where is the pantry key?"}, format="json")
    assert hit.json()["results"][0]["document_id"] == document_id
