"""A throwaway PostgreSQL cluster on a free port, to stop and start under load.

The shared server on 5432 must stay up for every other test, so a test that restarts the
database makes its own: ``initdb`` into a fresh folder, trust auth, listening on
127.0.0.1 only. As root (CI), PostgreSQL refuses to run, so the server tools run as the
``postgres`` user that Debian's packages create.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import free_port


def server_bin() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: on PATH, else Debian's versioned one."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(candidates[-1]).parent if candidates else None


class Cluster:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        self.data = Path(tempfile.mkdtemp(prefix="ragtier-pg-"))
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin_dir / tool), *args]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        # The server inherits no pipe of ours (its log goes to a file), or this would wait
        # for it to exit.
        subprocess.run(
            command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120
        )

    def create(self) -> Cluster:
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def _create(self) -> None:
        if self.as_root:
            shutil.chown(self.data, user="postgres", group="postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        self.start()

    def start(self) -> Cluster:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data} -c fsync=off"
        log = str(self.data / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "start")
        return self

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop()
        shutil.rmtree(self.data, ignore_errors=True)

    def wait_ready(self, timeout: float = 30) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def cluster_or_skip() -> Cluster:
    bin_dir = server_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL's server tools (initdb, pg_ctl) are not installed")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: PostgreSQL cannot be started")
    return Cluster(bin_dir).create()
