from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey, api_key_create
from tests import factories

REAL_EMBEDDER = "retrieval.embedders.SentenceTransformerEmbedder"


@pytest.fixture(scope="session", autouse=True)
def _end_stray_connections(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """In-process ASGI servers and async tests leave connections open in their worker
    threads; on PostgreSQL those would keep the test database from being dropped."""
    yield
    from django.db import connection

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


@pytest.fixture(autouse=True)
def _data_dir(settings: Any, tmp_path: Path) -> None:
    """Each test gets its own index and upload folders."""
    settings.INDEX_DIR = tmp_path / "indexes"
    settings.MEDIA_ROOT = tmp_path / "media"


@pytest.fixture(scope="session")
def milvus_lite(tmp_path_factory: Any) -> str:
    """Milvus Lite inside the test process (a ``.db`` path): one engine for the session."""
    return str(tmp_path_factory.mktemp("milvus") / "engine.db")


@pytest.fixture(params=["faiss", "milvus"])
def index_backend(request: Any, settings: Any) -> Iterator[str]:
    """The test once per index backend: FAISS segment files, then the Milvus engine (Milvus
    Lite), whose collection is dropped after each test (database ids are reused)."""
    settings.VECTOR_BACKEND = request.param
    if request.param == "faiss":
        yield request.param
        return
    settings.MILVUS_URI = request.getfixturevalue("milvus_lite")
    from apps.knowledge.backends.milvus import engine

    try:
        yield request.param
    finally:
        engine().drop()


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """A test marked ``faiss_only`` (segment files, compaction) runs on FAISS alone."""
    dropped = [
        item
        for item in items
        if item.get_closest_marker("faiss_only")
        and getattr(item, "callspec", None) is not None
        and item.callspec.params.get("index_backend") == "milvus"
    ]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


@pytest.fixture(autouse=True)
def _limiter_keys(settings: Any) -> None:
    """Each test's token buckets and stream slots under their own Redis key prefix."""
    import uuid

    prefix = f"ragtier:test:{uuid.uuid4().hex[:12]}:"
    settings.RATE_LIMIT_KEY_PREFIX = prefix
    settings.INFERENCE_QUEUE_KEY_PREFIX = f"{prefix}queue:"


@pytest.fixture(autouse=True)
def _key_probes() -> None:
    """Every client of a test shares one address: each test starts with its failed-key
    allowance whole (in Redis, the test's key prefix already keeps them apart)."""
    from apps.accounts.probes import local_probe_buckets

    local_probe_buckets().clear()


@pytest.fixture(autouse=True)
def _limits_cache() -> None:
    """Rows a test rolled back send no signal, and the next test's team may get the same
    id: each test starts with no limits cached."""
    from apps.usage.budgets import limits_cache

    limits_cache.clear()


@pytest.fixture(autouse=True)
def _request_buckets() -> None:
    """This process's request buckets are keyed by team id, which the next test may reuse:
    each test starts with full buckets (Redis keeps them under the test's own prefix)."""
    from apps.usage.request_rate import local_buckets

    local_buckets.clear()


def reachable_redis_url() -> str:
    """The Redis the suite may use (CI's ``REDIS_URL``, else the local one), or skip."""
    import os

    import redis

    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/15"
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {url}")
    finally:
        client.close()
    return url


@pytest.fixture(params=["database", "redis"])
def limiter_store(request: Any, settings: Any) -> str:
    """Run a test with buckets and slots in the database, then in real Redis."""
    settings.RATE_LIMIT_REDIS_URL = reachable_redis_url() if request.param == "redis" else ""
    return str(request.param)


@pytest.fixture
def team(db: None) -> Team:
    return factories.team(name="acme")


@pytest.fixture
def other_team(db: None) -> Team:
    return factories.team(name="globex")


@pytest.fixture
def issued_key(team: Team) -> IssuedKey:
    return api_key_create(team=team, name="test")


def client_for(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def api(issued_key: IssuedKey) -> APIClient:
    """An API client with a full-scope key of ``team``."""
    return client_for(issued_key.secret)


@pytest.fixture
def owner_api(team: Team, django_user_model: Any) -> APIClient:
    """A client with a full-scope key of an owner of ``team``: deleting collections and
    documents needs an owner or admin (``api``'s key, of no user, acts as a member)."""
    from apps.accounts.models import Membership
    from apps.accounts.services import membership_add

    user = django_user_model.objects.create_user("team-owner", password="a-long-password-1")
    membership_add(team=team, user=user, role=Membership.Role.OWNER)
    return client_for(api_key_create(team=team, name="owner", user=user).secret)


@pytest.fixture
def api_as(db: None) -> Callable[..., APIClient]:
    """A client for any team and scopes: ``api_as(team, scopes=["read"])``."""

    def make(team: Team, scopes: list[str] | None = None) -> APIClient:
        return client_for(api_key_create(team=team, scopes=scopes).secret)

    return make


@pytest.fixture
def run_on_commit(django_capture_on_commit_callbacks: Any) -> Iterator[None]:
    """Run on-commit work (ingestion is queued on commit) inside the test transaction."""
    with django_capture_on_commit_callbacks(execute=True):
        yield


@pytest.fixture
def upstream(settings: Any) -> Iterator[Any]:
    """The fake inference tier, with the fake tokenizer (counts words and punctuation)."""
    from tests.fake_upstream import fake_upstream

    with fake_upstream() as fake:
        settings.INFERENCE_BASE_URL = fake.base_url
        settings.TOKENIZER_BACKEND = "inference.tokenizers.FakeTokenizer"
        settings.TOKENIZER_OPTIONS = {}
        settings.INFERENCE_TIMEOUTS = {
            "connect": 2.0,
            "first_token": 5.0,
            "idle": 2.0,
            "total": 30.0,
        }
        yield fake


@pytest.fixture
def real_embedder(settings: Any) -> None:
    """The real all-MiniLM-L6-v2 from its package folder, instead of the fake."""
    settings.EMBEDDER_BACKEND = REAL_EMBEDDER
    settings.EMBEDDER_OPTIONS = {"model_path": None, "device": "auto"}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def llama_server() -> Iterator[str]:
    """The real embedded inference tier (llama.cpp serving SmolLM2), once per session."""
    yield from llama_server_run(n_ctx=2048)


def llama_server_run(*, n_ctx: int, **env: str) -> Iterator[str]:
    """``runinference`` in a process of its own, with ``env`` added to its environment;
    its base URL once it serves, until the generator is closed."""
    import os
    import subprocess
    import sys
    import time

    import httpx

    from config.env import BASE_DIR

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runinference", "--port", str(port), "--n-ctx", str(n_ctx)],
        cwd=BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail("the llama.cpp server exited at start-up")
            try:
                if httpx.get(f"{base_url}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail("the llama.cpp server did not start within 120 s")
        yield base_url
    finally:
        stop_process(process)


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: Any) -> Iterator[Any]:
    """A real vLLM (the CPU build) serving SmolLM2, once per session, warmed up: its first
    request for log probabilities compiles a kernel for many seconds."""
    from tests.vllm.server import vllm_server

    with vllm_server(log=tmp_path_factory.mktemp("vllm") / "server.log") as server:
        warm = {"model": server.model, "messages": [{"role": "user", "content": "Hi"}]}
        httpx.post(
            f"{server.base_url}/chat/completions",
            json={**warm, "max_tokens": 1, "logprobs": True, "top_logprobs": 2},
            timeout=120,
        ).raise_for_status()
        yield server


@pytest.fixture
def on_vllm(vllm: Any, settings: Any) -> Any:
    """The app pointed at the session's vLLM as a vLLM deployment is configured: its model
    folder's tokenizer and template (``hf:<folder>``), its context window read from the tier,
    every field honoured."""
    point_at_vllm(settings, vllm)
    return vllm


def point_at_vllm(settings: Any, server: Any, **small: Any) -> None:
    """Settings for ``server`` as a vLLM deployment sets them, ``small`` over the alias."""
    settings.INFERENCE_BASE_URL = server.base_url
    settings.INFERENCE_SERVER = "vllm"
    settings.TOKENIZER_BACKEND = "inference.tokenizers.HFTokenizer"
    settings.TOKENIZER_OPTIONS = {"path": str(server.folder)}
    settings.INFERENCE_UNSUPPORTED = []
    settings.INFERENCE_MAX_CONCURRENCY = 4
    alias = {"served_name": server.model, "context_window": None, **small}
    settings.MODEL_ALIASES = {"small": {**settings.MODEL_ALIASES["small"], **alias}}


@contextmanager
def milvus_lite_server(uri: str, data_dir: Path) -> Iterator[None]:
    """``milvus-lite server`` as runstack starts it (on ``uri``'s port, its data in
    ``data_dir``), once it listens; stopped as runstack stops it (SIGTERM)."""
    import subprocess
    import sys

    from apps.site.management.commands.runstack import milvus_argv, milvus_wait

    process = subprocess.Popen(
        milvus_argv(sys.executable, uri=uri, data_dir=data_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        milvus_wait(process, port=int(uri.rsplit(":", 1)[1]))
        yield
    finally:
        stop_process(process)


def stop_process(process: Any) -> None:
    """Terminate a child process, kill it if it lingers, and close its pipes."""
    import subprocess

    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


@pytest.fixture
def demo_corpus(team: Team) -> dict[int, str]:
    """The demo corpus ingested into ``team``'s collection ``ragtier-docs``: {id: filename}."""
    from io import StringIO

    from django.core.management import call_command

    from apps.knowledge.models import Document
    from config.env import BASE_DIR

    call_command(
        "ingest",
        str(BASE_DIR / "demo" / "corpus"),
        team=team.name,
        collection="ragtier-docs",
        no_progress=True,
        stdout=StringIO(),
        stderr=StringIO(),
    )
    return dict(Document.objects.filter(team=team).values_list("pk", "filename"))


def database_url() -> str:
    """This test's database, as other processes must reach it."""
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    password = f":{db['PASSWORD']}" if db["PASSWORD"] else ""
    return f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def asgi_workers(upstream: Any, tmp_path: Path) -> Iterator[Callable[..., list[str]]]:
    """Start ``count`` uvicorn processes serving the app against the fake tier, with
    ``**env`` on top of this test's settings; each answers /healthz before it returns."""
    import os
    import subprocess
    import sys
    import time

    import httpx

    from config.env import BASE_DIR

    processes: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start(*, count: int = 2, **extra: str) -> list[str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            "DATABASE_URL": database_url(),
            "RAGTIER_TEST_DATA_DIR": str(tmp_path),
            "INFERENCE_BASE_URL": upstream.base_url,
            "TOKENIZER_BACKEND": "inference.tokenizers.FakeTokenizer",
            "EMBEDDER_BACKEND": "retrieval.embedders.FakeEmbedder",
            # A fixed context window: no call to the tier's /models.
            "MODEL_SMALL_CONTEXT_WINDOW": "8192",
            **extra,
        }
        urls: list[str] = []
        for _ in range(count):
            port = free_port()
            # Not "worker-N.log": a test may start Celery workers beside them (their logs).
            log = tmp_path / f"asgi-{len(logs)}.log"
            logs.append(log)
            with log.open("wb") as out:
                processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "uvicorn",
                            "config.asgi:application",
                            "--port",
                            str(port),
                            "--log-level",
                            "warning",
                        ],
                        cwd=BASE_DIR,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
            urls.append(f"http://127.0.0.1:{port}")
        for process, url, log in zip(processes[-count:], urls, logs[-count:], strict=True):
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None:
                    pytest.fail(f"a worker exited at start-up:\n{log.read_text()}")
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"a worker did not answer /healthz in 60 s:\n{log.read_text()}")
                time.sleep(0.2)
        return urls

    try:
        yield start
    finally:
        for process in processes:
            stop_process(process)
        for log in logs:
            if log.exists() and log.read_text().strip():
                print(f"--- {log.name}\n{log.read_text()}")


@pytest.fixture(autouse=True)
def _usage_tags() -> None:
    """The tags this process knows a team has: keyed by team id, which the next test may
    reuse."""
    from apps.usage.tags import _known

    _known.clear()
