"""A real vLLM that dies mid-answer, is down, then is back: each as the error map says,
nothing lost. A server of this module's own (the session's must stay up for the rest)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from apps.accounts.models import Team
from apps.chat.models import Message
from apps.usage.models import UsageRecord
from tests.apps.chat.conftest import answer_frames, conversation_for
from tests.conftest import free_port, point_at_vllm
from tests.vllm.server import VLLMServer, vllm_server

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def doomed(tmp_path: Any, settings: Any) -> Iterator[VLLMServer]:
    """A vLLM the test may kill, the app pointed at it as ``on_vllm`` points it."""
    port = free_port()
    with vllm_server(log=tmp_path / "vllm.log", port=port) as server:
        point_at_vllm(settings, server, context_window=8192)
        settings.INFERENCE_RETRY_ATTEMPTS = 1
        yield server


def test_vllm_killed_mid_answer_then_down_then_back(
    doomed: VLLMServer, http: httpx.Client, team: Team, tmp_path: Any
) -> None:
    """SIGKILL while it streams: the native stream ends with an in-band ``error``, its
    ``usage`` and ``done``, the message is failed and its tokens so far billed; while it
    is down a whole /v1 answer is 502 inference_unavailable and a streamed one carries the
    same error in-band; once a server is back on the same address the next answer is
    whole (a connection refused opens no circuit for longer than its cool-off)."""
    conversation = conversation_for(http)
    body = {"content": "Write a very long story about a pump.", "max_tokens": 300}
    seen: list[dict[str, Any]] = []
    with answer_frames(http, conversation, **body, cache=False) as frames:
        for frame in frames:
            if "comment" in frame:
                continue
            seen.append(frame)
            if frame["event"] == "delta" and len(seen) == 6:
                doomed.kill()
    names = [f["event"] for f in seen]
    assert names[-3:] == ["error", "usage", "done"], names
    assert seen[-3]["data"]["code"] == "inference_unavailable", seen[-3]
    message = Message.objects.filter(role="assistant").latest("pk")
    assert message.status == Message.Status.FAILED
    row = UsageRecord.objects.filter(team=team, kind="chat").latest("pk")
    assert row.status == "error" and row.completion_tokens >= 1

    hi = {"model": "small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    hi |= {"rag": {"enabled": False}, "cache": False}
    down = http.post("/v1/chat/completions", json=hi)
    assert down.status_code == 502, down.text
    assert down.json()["error"]["code"] == "inference_unavailable"
    # A stream has begun before the tier is asked: the same error, in-band, then [DONE].
    streamed = http.post("/v1/chat/completions", json={**hi, "stream": True})
    assert streamed.status_code == 200
    assert '"code":"inference_unavailable"' in streamed.text
    assert streamed.text.rstrip().endswith("data: [DONE]")

    port = int(doomed.root.rsplit(":", 1)[1])
    with vllm_server(log=tmp_path / "again.log", port=port):
        again = http.post("/v1/chat/completions", json=hi)
        assert again.status_code == 200, again.text
        assert json.loads(again.text)["usage"]["completion_tokens"] >= 1
