"""``runstack`` with ``VECTOR_BACKEND=milvus``: it starts ``milvus-lite server`` on
MILVUS_URI's port, before web and worker, with its data under DATA_DIR/milvus, and only
when ``MILVUS_RUN_LOCAL`` says this machine runs the engine."""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.site.management.commands import runstack
from apps.site.management.commands.runstack import milvus_argv
from tests.conftest import free_port, milvus_lite_server


def test_milvus_argv_serves_milvus_uris_port_on_loopback(tmp_path: Path) -> None:
    data = tmp_path / "milvus"
    assert milvus_argv("/venv/bin/python", uri="http://127.0.0.1:19531", data_dir=data) == [
        "/venv/bin/python",
        "-m",
        "milvus_lite",
        "server",
        "--data-dir",
        str(data),
        "--host",
        "127.0.0.1",
        "--port",
        "19531",
    ]
    # Milvus's own port where the URI names none; localhost is this machine too.
    assert milvus_argv("python", uri="http://localhost", data_dir=data)[-1] == "19530"


@pytest.mark.parametrize(
    "uri",
    [
        "http://milvus-standalone:19530",  # another machine's engine
        "https://127.0.0.1:19530",  # milvus-lite server speaks no TLS
        str(Path("data") / "milvus.db"),  # in-process Milvus Lite: one process's own
    ],
)
def test_milvus_argv_refuses_an_engine_it_cannot_be(uri: str, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="MILVUS_RUN_LOCAL"):
        milvus_argv("python", uri=uri, data_dir=tmp_path)


class StartedProcess:
    """A child that is not really started. Web and worker have exited already, so
    runstack's loop ends at once; the engine runs until it is signalled, unless the test
    says it dies at start."""

    started: list[list[str]]
    signalled: list[int]
    engine_dies = False

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.started.append(argv)
        engine = "milvus_lite" in argv
        self.returncode: int | None = 1 if engine and self.engine_dies else None if engine else 0

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        self.signalled.append(signum)
        self.returncode = -signum

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


@pytest.fixture
def engine_port() -> Iterator[int]:
    """A port something listens on, as the engine runstack started would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture
def started(
    monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path, engine_port: int
) -> list[list[str]]:
    """The argv of each process ``runstack`` starts, in order (none is really started)."""
    StartedProcess.started, StartedProcess.signalled = [], []
    StartedProcess.engine_dies = False
    monkeypatch.setattr(runstack.subprocess, "Popen", StartedProcess)
    monkeypatch.setattr(runstack.signal, "signal", lambda *args: None)  # keep pytest's SIGTERM
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    settings.DATA_DIR = tmp_path
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.INFERENCE_RUN_LOCAL = False
    settings.MILVUS_URI = f"http://127.0.0.1:{engine_port}"
    return StartedProcess.started


def _names(argv_list: list[list[str]]) -> list[str]:
    """Each argv by the module it runs: [python, "-m", module, ...]."""
    return [argv[2] for argv in argv_list]


def test_runstack_starts_the_engine_first_and_stops_it_with_the_rest(
    started: list[list[str]], settings: Any, tmp_path: Path, engine_port: int
) -> None:
    settings.VECTOR_BACKEND = "milvus"
    settings.MILVUS_RUN_LOCAL = True
    call_command("runstack", stdout=StringIO(), stderr=StringIO())

    assert _names(started) == ["milvus_lite", "uvicorn", "celery"]
    assert started[0] == milvus_argv(
        sys.executable, uri=f"http://127.0.0.1:{engine_port}", data_dir=tmp_path / "milvus"
    )
    assert StartedProcess.signalled == [signal.SIGTERM]  # web and worker had exited


@pytest.mark.parametrize(
    ("backend", "run_local"),
    [("faiss", True), ("milvus", False)],  # no engine; another machine's engine
)
def test_runstack_starts_no_engine_unless_this_machine_runs_it(
    started: list[list[str]], settings: Any, backend: str, run_local: bool
) -> None:
    settings.VECTOR_BACKEND = backend
    settings.MILVUS_RUN_LOCAL = run_local
    call_command("runstack", stdout=StringIO(), stderr=StringIO())

    assert _names(started) == ["uvicorn", "celery"]


def test_an_engine_that_dies_at_start_stops_runstack_before_web_and_worker(
    started: list[list[str]], settings: Any
) -> None:
    settings.VECTOR_BACKEND = "milvus"
    settings.MILVUS_RUN_LOCAL = True
    StartedProcess.engine_dies = True
    with pytest.raises(CommandError, match="exited"):
        call_command("runstack", stdout=StringIO(), stderr=StringIO())
    assert _names(started) == ["milvus_lite"]


def test_runstack_refuses_to_serve_a_remote_milvus_uri(
    started: list[list[str]], settings: Any
) -> None:
    settings.VECTOR_BACKEND = "milvus"
    settings.MILVUS_RUN_LOCAL = True
    settings.MILVUS_URI = "http://milvus-standalone:19530"
    with pytest.raises(CommandError, match="MILVUS_RUN_LOCAL=false"):
        call_command("runstack", stdout=StringIO(), stderr=StringIO())
    assert started == []  # nothing started that would have to be stopped


@contextmanager
def _engine(uri: str, data_dir: Path) -> Iterator[Any]:
    """The server ``milvus_argv`` starts, and a client of it; stopped as runstack stops
    it (SIGTERM)."""
    from pymilvus import MilvusClient

    with milvus_lite_server(uri, data_dir):
        client = MilvusClient(uri=uri)
        yield client
        client.close()


@pytest.mark.integration
def test_the_engine_runstack_starts_serves_pymilvus_and_keeps_its_data(tmp_path: Path) -> None:
    uri, data_dir = f"http://127.0.0.1:{free_port()}", tmp_path / "milvus"
    with _engine(uri, data_dir) as client:
        client.create_collection("probe", dimension=4)
        client.insert("probe", [{"id": 7, "vector": [0.1, 0.2, 0.3, 0.4]}])
    # The next `make run` finds what the last one wrote, after a SIGTERM.
    with _engine(uri, data_dir) as client:
        client.load_collection("probe")
        assert [row["id"] for row in client.get("probe", ids=[7])] == [7]


@pytest.mark.integration
@pytest.mark.django_db
def test_setupdemo_on_the_engine_ingests_the_demo_corpus_into_a_local_engine_it_stops(
    settings: Any, tmp_path: Path
) -> None:
    from apps.knowledge.backends.milvus import engine
    from apps.knowledge.models import Collection

    settings.VECTOR_BACKEND, settings.MILVUS_RUN_LOCAL = "milvus", True
    settings.MILVUS_URI, settings.DATA_DIR = f"http://127.0.0.1:{free_port()}", tmp_path
    port = int(settings.MILVUS_URI.rsplit(":", 1)[1])
    call_command("setupdemo", stdout=StringIO(), stderr=StringIO())
    with socket.socket() as probe:  # stopped once the command is done
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    collection = Collection.objects.get(name="ragtier-docs")
    assert collection.index_backend == "milvus" and collection.index_version
    with milvus_lite_server(settings.MILVUS_URI, tmp_path / "milvus"):
        from apps.knowledge.backends.milvus import scope

        assert len(engine().ids(scope(collection))) == collection.chunks.count() > 0
