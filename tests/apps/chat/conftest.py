from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey
from tests.fake_upstream import ServerThread


@pytest.fixture
def asgi_server(transactional_db: None) -> Iterator[str]:
    """The whole ASGI app (body guard included) served by uvicorn on a real socket."""
    from config.asgi import application

    with ServerThread(application) as url:
        yield url


@pytest.fixture
def http(asgi_server: str, issued_key: IssuedKey) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {issued_key.secret}"}
    with httpx.Client(base_url=asgi_server, headers=headers, timeout=30) as client:
        yield client


def parse_sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """SSE frames as dicts: ``{"id", "event", "data"}`` (data decoded), or ``{"comment"}``."""
    frame: dict[str, Any] = {}
    data: list[str] = []
    for line in lines:
        if line == "":
            if data or frame:
                if data:
                    frame["data"] = json.loads("\n".join(data))
                yield frame
            frame, data = {}, []
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            else:
                frame[name] = value


def conversation_for(client: httpx.Client, **body: Any) -> int:
    response = client.post("/api/v1/conversations", json=body)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


@contextmanager
def answer_frames(
    client: httpx.Client, conversation_id: int, **body: Any
) -> Iterator[Iterator[dict[str, Any]]]:
    """A question's answer as SSE frames, read as they come; leaving the block closes the
    stream (the client goes away)."""
    with client.stream(
        "POST",
        f"/api/v1/conversations/{conversation_id}/messages",
        json=body,
        headers={"Accept": "text/event-stream"},
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield parse_sse(response.iter_lines())


def ask_stream(client: httpx.Client, conversation_id: int, **body: Any) -> list[dict[str, Any]]:
    with answer_frames(client, conversation_id, **body) as frames:
        return [f for f in frames if "comment" not in f]


@pytest.fixture
def acme(team: Team) -> Team:
    return team


@pytest.fixture
def sdk(asgi_server: str, issued_key: IssuedKey) -> Iterator[openai.OpenAI]:
    """The official OpenAI SDK, unmodified, against the running app."""
    client = openai.OpenAI(
        base_url=f"{asgi_server}/v1", api_key=issued_key.secret, max_retries=0, timeout=30
    )
    yield client
    client.close()


def client_script(argv: list[str], *, base_url: str, key: IssuedKey) -> Callable[..., Any]:
    """Run one case of a client script (``argv``, then the case's name and its options as
    JSON) against the app at ``base_url`` with ``key``; what it prints, decoded."""
    import os
    import subprocess

    from config.env import BASE_DIR

    env = {**os.environ, "RAGTIER_BASE_URL": base_url, "RAGTIER_API_KEY": key.secret}

    def run(case: str, **options: Any) -> Any:
        done = subprocess.run(
            [*argv, case, json.dumps(options)],
            cwd=BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout)

    return run
