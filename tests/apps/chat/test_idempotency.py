"""Idempotency-Key on POST …/messages and POST …/documents (the HTTP contract): a retry replays the
first result, another body is 422, a retry while the first runs is 409, and of two
concurrent first requests exactly one does the work."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import close_old_connections
from django.utils import timezone

from apps.accounts.models import Team
from apps.chat.models import Message
from apps.core.exceptions import IdempotencyInProgress, IdempotencyKeyReused
from apps.core.idempotency import (
    idempotency_claim,
    idempotency_complete,
    idempotency_fingerprint,
    idempotency_keys_purge_expired,
    idempotency_stale_after,
)
from apps.core.models import IdempotencyKey
from apps.knowledge.models import Document
from apps.usage.models import UsageRecord
from tests import factories
from tests.apps.chat.conftest import conversation_for, parse_sse
from tests.apps.chat.test_queue import wait_until
from tests.conftest import client_for
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def post(
    http: httpx.Client, path: str, key: str | None, *, stream: bool = False, **body: Any
) -> dict[str, Any]:
    headers = {"Idempotency-Key": key} if key else {}
    if stream:
        headers["Accept"] = "text/event-stream"
    with http.stream("POST", path, json=body, headers=headers) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            frames = [f for f in parse_sse(response.iter_lines()) if "comment" not in f]
            return {"status": response.status_code, "events": frames, "headers": response.headers}
        response.read()
        return {
            "status": response.status_code,
            "json": response.json(),
            "headers": response.headers,
        }


def ask(http: httpx.Client, conversation: int, key: str | None, **body: Any) -> dict[str, Any]:
    body = {"content": "Say hello", "top_k": 0, **body}
    return post(http, f"/api/v1/conversations/{conversation}/messages", key, **body)


def test_a_retry_replays_the_answer_and_charges_once(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    conversation = conversation_for(http)
    first = ask(http, conversation, "retry-1")
    again = ask(http, conversation, "retry-1")
    assert first["status"] == again["status"] == 201
    assert again["json"] == first["json"]
    assert again["headers"]["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first["headers"]
    assert len(upstream.requests) == 1
    assert UsageRecord.objects.filter(kind="chat").count() == 1
    assert Message.objects.filter(role="assistant").count() == 1
    # Asked for the stream this time: the first answer's events, replayed.
    replayed = ask(http, conversation, "retry-1", stream=True)
    assert replayed["status"] == 200
    events = replayed["events"]
    assert events[0]["event"] == "message" and events[-1]["event"] == "done"
    assert events[0]["data"]["message_id"] == first["json"]["id"]
    assert "".join(e["data"]["text"] for e in events if e["event"] == "delta") == "Hello world."
    assert len(upstream.requests) == 1


def test_a_streamed_answer_replays_its_events(upstream: FakeUpstream, http: httpx.Client) -> None:
    conversation = conversation_for(http)
    first = ask(http, conversation, "stream-1", stream=True)
    again = ask(http, conversation, "stream-1", stream=True)
    strip = [(e["id"], e["event"], e["data"]) for e in first["events"]]
    assert [(e["id"], e["event"], e["data"]) for e in again["events"]] == strip
    assert len(upstream.requests) == 1
    assert UsageRecord.objects.filter(kind="chat").count() == 1


def test_another_body_with_the_key_is_422(upstream: FakeUpstream, http: httpx.Client) -> None:
    conversation = conversation_for(http)
    assert ask(http, conversation, "reused")["status"] == 201
    other = ask(http, conversation, "reused", content="Something else")
    assert other["status"] == 422
    assert other["json"]["error"]["code"] == "idempotency_key_reused"
    elsewhere = ask(http, conversation_for(http), "reused")  # same body, another path
    assert elsewhere["status"] == 422
    assert len(upstream.requests) == 1


def test_while_the_first_runs_a_retry_is_409(upstream: FakeUpstream, http: httpx.Client) -> None:
    upstream.script.tokens = [f" w{i}" for i in range(20)]
    upstream.script.delay = 0.05
    conversation = conversation_for(http)
    results: list[dict[str, Any]] = []
    first = threading.Thread(target=lambda: results.append(ask(http, conversation, "slow")))
    first.start()
    try:
        wait_until(lambda: len(upstream.requests) == 1)
        during = ask(http, conversation, "slow")
    finally:
        first.join(timeout=30)
    assert during["status"] == 409
    assert during["json"]["error"] == {
        "type": "conflict_error",
        "code": "idempotency_in_progress",
        "message": during["json"]["error"]["message"],
        "param": "Idempotency-Key",
    }
    assert results[0]["status"] == 201
    assert ask(http, conversation, "slow")["json"]["id"] == results[0]["json"]["id"]
    assert len(upstream.requests) == 1


def test_two_concurrent_first_requests_do_the_work_once(
    upstream: FakeUpstream, asgi_server: str, http: httpx.Client, issued_key: Any
) -> None:
    upstream.script.delay = 0.02
    conversation = conversation_for(http)
    barrier = threading.Barrier(2)
    results: list[dict[str, Any]] = []

    def racer() -> None:
        with httpx.Client(base_url=asgi_server, headers=http.headers, timeout=30) as own:
            barrier.wait()
            results.append(ask(own, conversation, "race"))

    threads = [threading.Thread(target=racer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    statuses = sorted(r["status"] for r in results)
    assert statuses in ([201, 201], [201, 409]), results
    ids = {r["json"]["id"] for r in results if r["status"] == 201}
    assert len(ids) == 1
    assert len(upstream.requests) == 1
    assert Message.objects.filter(role="assistant").count() == 1
    assert UsageRecord.objects.filter(kind="chat").count() == 1


def test_a_failed_first_request_lets_a_retry_run(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.script.fail_status, upstream.script.fail_times = 500, 100  # past every retry
    conversation = conversation_for(http)
    assert ask(http, conversation, "flaky")["status"] == 502
    upstream.script.fail_status = None
    retried = ask(http, conversation, "flaky")
    assert retried["status"] == 201 and "idempotent-replayed" not in retried["headers"]
    assert ask(http, conversation, "flaky")["json"]["id"] == retried["json"]["id"]


def test_keys_are_scoped_to_the_team(
    upstream: FakeUpstream, http: httpx.Client, asgi_server: str, other_team: Team
) -> None:
    from apps.accounts.services import api_key_create

    mine = ask(http, conversation_for(http), "shared-key")
    secret = api_key_create(team=other_team).secret
    with httpx.Client(
        base_url=asgi_server, headers={"Authorization": f"Bearer {secret}"}, timeout=30
    ) as theirs:
        their = ask(theirs, conversation_for(theirs), "shared-key")
    assert mine["status"] == their["status"] == 201
    assert mine["json"]["id"] != their["json"]["id"]
    assert len(upstream.requests) == 2


def test_an_invalid_key_is_400(upstream: FakeUpstream, http: httpx.Client) -> None:
    refused = ask(http, conversation_for(http), "x" * 256)
    assert refused["status"] == 400 and refused["json"]["error"]["param"] == "Idempotency-Key"
    assert not upstream.requests


def test_documents_replay_the_same_document(team: Team, issued_key: Any) -> None:
    api = client_for(issued_key.secret)
    collection = factories.collection(team=team)
    path = f"/api/v1/collections/{collection.pk}/documents"
    body = {"title": "Notes", "text": "Owls hunt at night."}
    first = api.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY="doc-1")
    again = api.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY="doc-1")
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    other = api.post(
        path, {**body, "text": "Bats too."}, format="json", HTTP_IDEMPOTENCY_KEY="doc-1"
    )
    assert other.status_code == 422
    assert Document.objects.count() == 1
    # A multipart retry has a new boundary but the same file: a replay, not a reuse.
    from django.core.files.uploadedfile import SimpleUploadedFile

    def upload() -> Any:
        return api.post(
            path,
            {"file": SimpleUploadedFile("a.txt", b"Moles dig.", content_type="text/plain")},
            format="multipart",
            HTTP_IDEMPOTENCY_KEY="doc-2",
        )

    uploaded, retried = upload(), upload()
    assert uploaded.status_code == retried.status_code == 202
    assert retried.json()["id"] == uploaded.json()["id"]
    assert Document.objects.count() == 2


def test_the_claim_is_atomic_across_threads(team: Team) -> None:
    """Of many concurrent first claims, exactly one inserts; the others see it running."""
    barrier = threading.Barrier(6)
    outcomes: list[str] = []

    def claim() -> None:
        barrier.wait()
        try:
            claimed = idempotency_claim(team=team, key="k", fingerprint="f")
            outcomes.append("claimed" if claimed.status == "running" else "replay")
        except IdempotencyInProgress:
            outcomes.append("409")
        finally:
            close_old_connections()

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["409"] * 5 + ["claimed"]
    assert IdempotencyKey.objects.count() == 1


def test_keys_expire_and_the_beat_job_purges_them(team: Team) -> None:
    claim = idempotency_claim(team=team, key="old", fingerprint="f")
    idempotency_complete(claim=claim, resource_id=1, response_status=201)
    later = timezone.now() + timedelta(hours=25)
    with pytest.raises(IdempotencyKeyReused):
        idempotency_claim(team=team, key="old", fingerprint="g")
    fresh = idempotency_claim(team=team, key="old", fingerprint="g", now=later)
    assert fresh.status == IdempotencyKey.Status.RUNNING and fresh.pk != claim.pk
    idempotency_complete(claim=fresh, resource_id=2, response_status=201)
    assert idempotency_keys_purge_expired(now=later) == 0
    assert idempotency_keys_purge_expired(now=later + timedelta(hours=25)) == 1
    assert not IdempotencyKey.objects.exists()


def test_a_first_request_that_died_running_stops_blocking_retries(team: Team) -> None:
    """A process that crashed mid-answer leaves its claim ``running``: past the bound it is
    abandoned, and the next request with the key does the work."""
    bound = idempotency_stale_after()
    started = timezone.now()
    dead = idempotency_claim(team=team, key="crashed", fingerprint="f", now=started)
    IdempotencyKey.objects.filter(pk=dead.pk).update(created_at=started)

    with pytest.raises(IdempotencyInProgress):
        idempotency_claim(team=team, key="crashed", fingerprint="f", now=started + bound / 2)
    retry = idempotency_claim(team=team, key="crashed", fingerprint="f", now=started + bound)
    assert retry.status == IdempotencyKey.Status.RUNNING and retry.pk != dead.pk
    assert list(IdempotencyKey.objects.values_list("pk", flat=True)) == [retry.pk]


def test_the_stale_bound_outlasts_the_longest_answer(settings: Any) -> None:
    settings.IDEMPOTENCY_STALE_SECONDS = 60
    settings.INFERENCE_QUEUE_TIMEOUT = 30.0
    settings.INFERENCE_TIMEOUTS = {**settings.INFERENCE_TIMEOUTS, "total": 900.0}
    assert idempotency_stale_after() == timedelta(seconds=930)
    settings.IDEMPOTENCY_STALE_SECONDS = 3600
    assert idempotency_stale_after() == timedelta(hours=1)


def test_a_retry_over_http_after_a_crash_answers(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    conversation = conversation_for(http)
    path = f"/api/v1/conversations/{conversation}/messages"
    body = {"content": "Say hello", "top_k": 0}
    crashed_at = timezone.now() - idempotency_stale_after() - timedelta(seconds=1)
    # What the crashed process left: its claim, running, with this request's fingerprint.
    dead = IdempotencyKey.objects.create(
        team=team,
        key="after-crash",
        fingerprint=idempotency_fingerprint(method="POST", path=path, body=body),
        expires_at=timezone.now() + timedelta(hours=23),
    )
    IdempotencyKey.objects.filter(pk=dead.pk).update(created_at=crashed_at)

    answered = ask(http, conversation, "after-crash")
    assert answered["status"] == 201, answered
    assert len(upstream.requests) == 1
    assert ask(http, conversation, "after-crash")["json"]["id"] == answered["json"]["id"]
