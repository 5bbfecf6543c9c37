"""What is kept of a conversation, and how: encrypted, never logged, purged on time,
deleted with everything it left, and not kept at all for /v1 unless asked."""

from __future__ import annotations

import logging
import subprocess
import uuid
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from apps.accounts.models import Team
from apps.chat.models import Conversation, Message, MessageEvent
from apps.chat.services.retention import retention_purge
from apps.knowledge.models import Document
from apps.knowledge.services import collection_delete, document_delete, index_store
from apps.usage.models import UsageRecord
from tests import factories
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.conftest import reachable_redis_url
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def canaries() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:12]
    return f"QCANARY{tag}", f"ACANARY{tag}"


def database_bytes() -> bytes:
    """The SQLite file with its write-ahead log (what a stolen disk would hold), read by
    another process: closing a descriptor of the file in this one would drop the POSIX
    locks SQLite holds on it here, and let another process corrupt it."""
    name = Path(connection.settings_dict["NAME"])
    paths = [str(path) for path in (name, Path(f"{name}-wal")) if path.exists()]
    return subprocess.run(["cat", *paths], capture_output=True, check=True).stdout


def redis_values(url: str) -> bytes:
    import redis

    client = redis.Redis.from_url(url)
    try:
        dump: list[bytes] = []
        for key in client.scan_iter(count=1000):
            dump.append(key)
            kind = client.type(key)
            if kind == b"string":
                dump.append(client.get(key) or b"")
            elif kind == b"list":
                dump.extend(client.lrange(key, 0, -1))
            elif kind == b"hash":
                for field, value in client.hgetall(key).items():
                    dump.extend([field, value])
            elif kind in (b"set", b"zset"):
                dump.extend(client.zrange(key, 0, -1) if kind == b"zset" else client.smembers(key))
            elif kind == b"stream":
                dump.extend(repr(client.xrange(key)).encode())
        return b"\n".join(dump)
    finally:
        client.close()


def ask_everywhere(http: httpx.Client, question: str) -> None:
    conversation = conversation_for(http)
    frames = ask_stream(http, conversation, content=question, top_k=0)
    assert frames[-1]["event"] == "done"
    replay = http.get(f"/api/v1/messages/{frames[0]['data']['message_id']}/events")
    assert replay.status_code == 200
    body = {"content": question, "top_k": 0}
    answered = http.post(f"/api/v1/conversations/{conversation}/messages", json=body)
    assert answered.status_code == 201, answered.text
    completion = {
        "model": "small",
        "messages": [{"role": "user", "content": question}],
        "rag": {"enabled": False},
        "store": True,
    }
    assert http.post("/v1/chat/completions", json=completion).status_code == 200
    assert http.post("/v1/chat/completions", json={**completion, "stream": True}).is_success


@pytest.mark.parametrize("buffers", ["database", "redis"])
def test_canaries_appear_in_no_log_no_database_byte_and_no_redis_value(
    buffers: str,
    upstream: FakeUpstream,
    http: httpx.Client,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    redis_url = reachable_redis_url() if buffers == "redis" else ""
    settings.STREAM_BUFFER_REDIS_URL = redis_url
    question, answer = canaries()
    upstream.script.tokens = ["The", f" {answer}", "."]
    caplog.set_level(logging.DEBUG)
    ask_everywhere(http, question)
    # A failing tier, and a failure mid-stream, log what they log: still no content.
    upstream.script.fail_status, upstream.script.fail_times = 500, 100  # past every retry
    conversation = conversation_for(http)
    failed = http.post(
        f"/api/v1/conversations/{conversation}/messages", json={"content": question, "top_k": 0}
    )
    assert failed.status_code == 502
    upstream.script.fail_status, upstream.script.drop_after = None, 1
    ask_stream(http, conversation, content=question, top_k=0)

    # What was stored reads back in clear through the models.
    stored = "".join(Message.objects.values_list("content", flat=True))
    assert question in stored and answer in stored
    logged = caplog.text + "".join(
        f"{record.getMessage()} {record.args!r} {record.exc_text or ''}"
        for record in caplog.records
    )
    assert question not in logged and answer not in logged
    if connection.vendor == "sqlite":
        on_disk = database_bytes()
        assert question.encode() not in on_disk and answer.encode() not in on_disk
    if redis_url:
        in_redis = redis_values(redis_url)
        assert in_redis, "the answers' events were buffered in Redis"
        assert question.encode() not in in_redis and answer.encode() not in in_redis


def completion(http: httpx.Client, **extra: Any) -> httpx.Response:
    body = {"model": "small", "messages": [{"role": "user", "content": "Say hello"}], **extra}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def test_v1_stores_nothing_but_the_usage_row_by_default(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    first = completion(http)
    completion(http, stream=True, stream_options={"include_usage": True})
    assert first.json()["choices"][0]["message"]["content"] == "Hello world."
    assert not Conversation.objects.exists()
    assert not Message.objects.exists() and not MessageEvent.objects.exists()
    records = list(UsageRecord.objects.filter(kind="chat"))
    assert len(records) == 2 and all(r.total_tokens > 0 for r in records)
    assert records[0].object_id == first.json()["id"].removeprefix("chatcmpl-") or (
        records[1].object_id == first.json()["id"].removeprefix("chatcmpl-")
    )


def test_v1_stores_the_exchange_when_asked(
    upstream: FakeUpstream, http: httpx.Client, settings: Any
) -> None:
    completion(http, store=True)
    conversation = Conversation.objects.get()
    assert dict(conversation.messages.values_list("role", "content")) == {
        "user": "Say hello",
        "assistant": "Hello world.",
    }
    settings.OPENAI_STORE_DEFAULT = True
    completion(http)
    completion(http, store=False)
    assert Conversation.objects.count() == 2
    assert UsageRecord.objects.filter(kind="chat").count() == 3


def old_conversation(team: Team, *, days: int, status: str = "complete") -> Conversation:
    conversation = Conversation.objects.create(team=team, title="t")
    question = Message.objects.create(
        conversation=conversation, team=team, role="user", content="q"
    )
    answer = Message.objects.create(
        conversation=conversation, team=team, role="assistant", content="a", status=status
    )
    MessageEvent.objects.create(message=answer, seq=1, event="delta", data={"text": "a"})
    then = timezone.now() - timedelta(days=days)
    Message.objects.filter(pk__in=[question.pk, answer.pk]).update(created_at=then)
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=then)
    UsageRecord.objects.create(
        team=team, kind="chat", model="small", prompt_tokens=5, object_id=str(answer.pk)
    )
    return conversation


def test_retention_purges_old_conversations_and_keeps_the_ledger(team: Team) -> None:
    other = factories.team(name="keeps-everything")
    team.retention_days = 30
    team.save()
    old = old_conversation(team, days=31)
    recent = old_conversation(team, days=29)
    streaming = old_conversation(team, days=31, status="streaming")
    untouched = old_conversation(other, days=400)
    purged = retention_purge()
    assert purged[team.name].conversations == 1 and purged[team.name].messages == 3
    assert not Conversation.objects.filter(pk=old.pk).exists()
    assert set(Conversation.objects.values_list("pk", flat=True)) == {
        recent.pk,
        streaming.pk,
        untouched.pk,
    }
    assert Message.objects.filter(conversation=streaming, status="streaming").exists()
    assert UsageRecord.objects.count() == 4  # tokens and cost stay; no content in them
    assert other.name not in purged


def test_the_purge_command(team: Team) -> None:
    old_conversation(team, days=10)
    kept = old_conversation(team, days=2)
    out = StringIO()
    call_command("purge", team=team.name, older_than_days=5, stdout=out)
    assert "1 conversations, 2 messages, 1 stored events" in out.getvalue()
    assert list(Conversation.objects.values_list("pk", flat=True)) == [kept.pk]
    assert UsageRecord.objects.count() == 2


def test_deleting_a_conversation_drops_its_redis_buffers(
    upstream: FakeUpstream, http: httpx.Client, settings: Any
) -> None:
    import redis

    url = reachable_redis_url()
    settings.STREAM_BUFFER_REDIS_URL = url
    conversation = conversation_for(http)
    frames = ask_stream(http, conversation, content="Say hello", top_k=0)
    key = f"ragtier:events:{frames[0]['data']['message_id']}"
    client = redis.Redis.from_url(url)
    try:
        assert client.exists(key)
        assert http.delete(f"/api/v1/conversations/{conversation}").status_code == 204
        assert not client.exists(key)
    finally:
        client.close()


@pytest.mark.django_db(transaction=False)
def test_deleting_a_collection_leaves_no_file(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    collection = factories.collection(team=team)
    documents = [
        factories.file_document(collection=collection, name=f"{n}.txt", data=f"text {n}".encode())
        for n in ("one", "two")
    ]
    files = [Path(d.source.path) for d in documents]
    index_folder = Path(index_store().root) / collection.index_key
    assert all(f.exists() for f in files) and index_folder.exists()
    with django_capture_on_commit_callbacks(execute=True):
        collection_delete(collection=collection)
    assert not any(f.exists() for f in files)
    assert not index_folder.exists()
    assert not Document.objects.exists()


@pytest.mark.django_db(transaction=False)
def test_deleting_a_document_removes_its_file(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    collection = factories.collection(team=team)
    document = factories.file_document(collection=collection, name="x.txt", data=b"some text")
    path = Path(document.source.path)
    assert path.exists()
    with django_capture_on_commit_callbacks(execute=True):
        document_delete(document=document)
    assert not path.exists()
