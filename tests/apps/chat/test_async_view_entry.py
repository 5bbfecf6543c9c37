"""AsyncApiView checks the caller on the event loop when that needs no database (a cached
API key), and on the database pool when it does."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from apps.accounts.selectors import api_key_cache
from apps.core.aio import AsyncApiView


def test_a_cached_key_is_checked_on_the_loop_and_a_new_one_on_the_pool(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[tuple[str, str]] = []  # (thread, outcome) per run of AsyncApiView.initial
    initial = AsyncApiView.initial

    def recorded(self: AsyncApiView, request: Any, *args: Any, **kwargs: Any) -> None:
        thread = threading.current_thread().name
        try:
            initial(self, request, *args, **kwargs)
        except Exception as exc:
            runs.append((thread, type(exc).__name__))
            raise
        runs.append((thread, "ok"))

    monkeypatch.setattr(AsyncApiView, "initial", recorded)
    body = {"model": "small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}

    api_key_cache().clear()
    assert http.post("/v1/chat/completions", json=body).status_code == 400  # past the checks
    loop_thread, outcome = runs[0]
    assert outcome == "SynchronousOnlyOperation"  # the key had to be read: refused there
    assert runs[1][0].startswith("ragtier-db") and runs[1][1] == "ok"

    runs.clear()
    assert http.post("/v1/chat/completions", json=body).status_code == 400
    assert runs == [(loop_thread, "ok")]  # cached now: no hop to the pool

    unknown = {"Authorization": "Bearer rt_nope_nope"}
    assert http.post("/v1/chat/completions", json=body, headers=unknown).status_code == 401
