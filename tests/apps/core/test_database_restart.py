"""PostgreSQL restarted under load (its own throwaway cluster, tests/pg_cluster.py).

While the database is down every request answers ``503 database_unavailable`` with a
``Retry-After``, never a 500; once it is back, the web process recovers by itself; and
every write the API acknowledged (a collection's 201, an answer's ``usage`` event) is in
the database afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest

from config.env import BASE_DIR
from tests.apps.chat.conftest import parse_sse
from tests.pg_cluster import Cluster, cluster_or_skip

DOWN_SECONDS = 3.0


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = cluster_or_skip()
    try:
        yield made
    finally:
        made.remove()


def manage(cluster: Cluster, *args: str) -> str:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": cluster.url,
    }
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout.strip()


class Load:
    """Threads writing through the API until stopped; what was acknowledged, and every
    status seen with its error code."""

    def __init__(self, url: str, secret: str) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {secret}"}
        self.running = True
        self.lock = threading.Lock()
        self.statuses: Counter[tuple[int, str]] = Counter()
        self.retry_after: set[str] = set()
        self.collections: list[int] = []
        self.messages: list[int] = []
        self.threads = [
            threading.Thread(target=self.loop, args=(self.create_collection,), daemon=True),
            threading.Thread(target=self.loop, args=(self.create_collection,), daemon=True),
            threading.Thread(target=self.loop, args=(self.answer,), daemon=True),
        ]

    def seen(self, response: httpx.Response) -> bool:
        code = ""
        if response.status_code >= 400:
            code = response.json()["error"]["code"]
            self.retry_after.add(response.headers.get("Retry-After", ""))
        with self.lock:
            self.statuses[(response.status_code, code)] += 1
        return response.status_code < 400

    def create_collection(self, client: httpx.Client) -> None:
        response = client.post("/api/v1/collections", json={"name": uuid.uuid4().hex})
        if self.seen(response):
            self.collections.append(int(response.json()["id"]))

    def answer(self, client: httpx.Client) -> None:
        response = client.post("/api/v1/conversations", json={})
        if not self.seen(response):
            return
        conversation = response.json()["id"]
        with client.stream(
            "POST",
            f"/api/v1/conversations/{conversation}/messages",
            json={"content": "Hi", "top_k": 0},
            headers={"Accept": "text/event-stream"},
        ) as streamed:
            if streamed.status_code != 200:
                streamed.read()
                self.seen(streamed)
                return
            frames = [f for f in parse_sse(streamed.iter_lines()) if "comment" not in f]
            self.seen(streamed)
        events = {f["event"]: f.get("data") for f in frames}
        if "usage" in events and "error" not in events:
            self.messages.append(int(events["message"]["message_id"]))

    def loop(self, step: Callable[[httpx.Client], None]) -> None:
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=30) as client:
            while self.running:
                step(client)
                time.sleep(0.02)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running = False
        for thread in self.threads:
            thread.join(timeout=60)

    def successes_since(self, mark: int) -> int:
        with self.lock:
            return sum(n for (status, _), n in self.statuses.items() if status < 400) - mark


def in_database(cluster: Cluster, sql: str, ids: list[int]) -> set[int]:
    with psycopg.connect(cluster.url) as connection:
        rows = connection.execute(sql, (ids,)).fetchall()
    return {int(row[0]) for row in rows}


@pytest.mark.integration
def test_a_database_restart_answers_503_and_loses_no_acknowledged_write(
    cluster: Cluster, asgi_workers: Callable[..., list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    manage(cluster, "migrate", "--noinput")
    manage(cluster, "createteam", "restart")
    secret = manage(cluster, "createapikey", "--team", "restart")
    (url,) = asgi_workers(count=1, DATABASE_URL=cluster.url)

    with Load(url, secret) as load:
        while load.successes_since(0) < 10:
            time.sleep(0.1)
        cluster.stop()
        time.sleep(DOWN_SECONDS)
        down = dict(load.statuses)
        cluster.start()
        cluster.wait_ready()
        recovered_from = load.successes_since(0)
        deadline = time.monotonic() + 60
        while load.successes_since(recovered_from) < 10:
            assert time.monotonic() < deadline, f"no recovery after the restart: {load.statuses}"
            time.sleep(0.1)

    with capsys.disabled():
        print(f"\nstatuses over the restart: {dict(load.statuses)} (at the stop: {down})")
    assert all(status < 500 or code == "database_unavailable" for status, code in load.statuses)
    assert (503, "database_unavailable") in load.statuses
    assert load.retry_after - {""}, "503s carry Retry-After"

    assert load.collections and load.messages
    stored = in_database(
        cluster, "SELECT id FROM knowledge_collection WHERE id = ANY(%s)", load.collections
    )
    assert stored == set(load.collections)
    # An answer whose settlement met the outage is written by its retries in the background.
    keys = [str(m) for m in load.messages]
    deadline = time.monotonic() + 90
    while True:
        with psycopg.connect(cluster.url) as connection:
            settled = connection.execute(
                "SELECT count(DISTINCT object_id) FROM usage_usagerecord WHERE object_id = ANY(%s)",
                (keys,),
            ).fetchone()
        if settled and settled[0] == len(keys):
            break
        assert time.monotonic() < deadline, f"{len(keys) - (settled or [0])[0]} answers unsettled"
        time.sleep(1)
    complete = in_database(
        cluster,
        "SELECT id FROM chat_message WHERE id = ANY(%s) AND status = 'complete'",
        load.messages,
    )
    assert complete == set(load.messages)
