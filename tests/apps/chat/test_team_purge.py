"""Deleting a team, in the admin or with ``manage.py deleteteam``: everything it owns goes
(rows, index folders, uploaded files, cached answers, its limiters' Redis keys), through
the services each part's own delete uses, and the audit log says what went. Another
team's work is untouched.

Issue 27, item 9: the admin's team delete was the database's cascade: index folders,
files, cached answers and Redis keys stayed behind.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.utils import timezone

from apps.accounts.models import ApiKey, Team
from apps.accounts.services import api_key_create
from apps.chat.models import Conversation, Message
from apps.chat.response_cache import response_cache
from apps.chat.services.replay import replay_slot_take
from apps.core.models import AuditEvent, ResponseCacheEntry
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import index_store
from apps.usage.budgets import budget_reserve, budget_settle
from apps.usage.models import Limit, Reservation, UsageRecord
from apps.usage.request_rate import request_admit
from tests import factories
from tests.conftest import reachable_redis_url

pytestmark = pytest.mark.django_db

OWNED = [Collection, Document, Conversation, Message, ApiKey, UsageRecord, Limit]
OPEN_REPLAYS: list[Any] = []
"""Replay slots held open (a slot dropped is given back)."""


@pytest.fixture
def redis_url(settings: Any) -> str:
    """Limiters and the response cache in real Redis, under keys of this test's own."""
    url = reachable_redis_url()
    settings.RATE_LIMIT_REDIS_URL = url
    settings.RESPONSE_CACHE_REDIS_URL = url
    settings.RESPONSE_CACHE_KEY_PREFIX = f"ragtier:test:{uuid.uuid4().hex[:12]}:rcache:"
    settings.RESPONSE_CACHE_TTL = 3600
    return url


def furnish(team: Team) -> Path:
    """A team with a bit of everything: an indexed uploaded file, a conversation, a key,
    limits that have been drawn on, a cached answer. Returns the file's path."""
    collection = factories.collection(team=team, name=f"{team.name} docs")
    document = factories.file_document(
        collection=collection, name="manual.txt", data=f"The {team.name} manual.".encode()
    )
    conversation = Conversation.objects.create(team=team, title="hello")
    Message.objects.create(conversation=conversation, team=team, role="user", content="Hi")
    api_key_create(team=team, name="ci")
    Limit.objects.create(team=team, burst_tokens=1000, tokens_per_minute=600, daily_tokens=10**6)
    budget_settle(reservation=budget_reserve(team=team, api_key=None, tokens=40), actual=30)
    request_admit(team=team)  # its request bucket
    OPEN_REPLAYS.append(replay_slot_take(team=team))  # a replay left open
    cache_answer(team)
    return Path(document.source.path)


def cache_answer(team: Team) -> None:
    if settings.RESPONSE_CACHE_REDIS_URL:

        async def put() -> None:
            await response_cache().put(team_id=team.pk, key="a" * 64, payload="{}", ttl=600)

        async_to_sync(put)()
    else:  # the database store's put runs on a thread of its own: not in a test transaction
        expires_at = timezone.now() + timedelta(minutes=10)
        ResponseCacheEntry.objects.create(
            team=team, key="a" * 64, payload="{}", expires_at=expires_at
        )


def redis_keys(url: str, *patterns: str) -> set[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return {key for pattern in patterns for key in client.scan_iter(match=pattern)}
    finally:
        client.close()


def limiter_patterns(settings: Any, team: Team) -> list[str]:
    prefix = settings.RATE_LIMIT_KEY_PREFIX
    ids = Limit.objects.filter(team=team).values_list("pk", flat=True)
    own = [f"{prefix}requests:*:{team.pk}", f"{prefix}replays:{team.pk}"]
    for pk in ids:
        own += [f"{prefix}bucket:{pk}", f"{prefix}streams:{pk}", f"{prefix}quota:{pk}:*"]
    return own


def test_a_team_deleted_in_the_admin_leaves_nothing_and_another_team_whole(
    team: Team,
    other_team: Team,
    admin_client: Client,
    redis_url: str,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    ours, theirs = furnish(team), furnish(other_team)
    root = Path(index_store().root)
    folders = {t: root / Collection.objects.get(team=t).index_key for t in (team, other_team)}
    our_limiter_keys = redis_keys(redis_url, *limiter_patterns(settings, team))
    their_limiter_keys = redis_keys(redis_url, *limiter_patterns(settings, other_team))
    assert our_limiter_keys and their_limiter_keys
    assert any(b":requests:" in key for key in our_limiter_keys)
    assert any(b":replays:" in key for key in our_limiter_keys)
    cache = settings.RESPONSE_CACHE_KEY_PREFIX
    assert redis_keys(redis_url, f"{cache}{team.pk}*")

    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(f"/admin/accounts/team/{team.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302

    assert not Team.objects.filter(pk=team.pk).exists()
    for model in OWNED:
        assert not model.objects.filter(team_id=team.pk).exists(), model.__name__
    assert not Reservation.objects.filter(team_id=team.pk).exists()
    assert not Chunk.objects.filter(collection__team_id=team.pk).exists()
    assert not ResponseCacheEntry.objects.filter(team_id=team.pk).exists()
    assert not folders[team].exists()
    assert not ours.exists()
    assert not redis_keys(redis_url, f"{cache}{team.pk}*")
    assert not redis_keys(redis_url, *[key.decode() for key in our_limiter_keys])

    event = AuditEvent.objects.get(action=AuditEvent.Action.TEAM_PURGED)
    assert (event.actor, event.target) == ("user admin", f"team {team.pk} acme")
    report = event.detail
    assert {name: report[name] for name in ("conversations", "messages", "collections")} == {
        "conversations": 1,
        "messages": 1,
        "collections": 1,
    }
    assert (report["documents"], report["index_folders"], report["files"]) == (1, 1, 1)
    assert (report["cached_answers"], report["keys"]) == (1, 1)
    assert report["limiter_keys"] == len(our_limiter_keys)
    assert report["rows"]["usage.UsageRecord"] == 1

    # The other team: every row, folder, file, cached answer and Redis key still there.
    for model in OWNED:
        assert model.objects.filter(team=other_team).exists(), model.__name__
    assert Chunk.objects.filter(collection__team=other_team).exists()
    assert folders[other_team].is_dir() and theirs.exists()
    assert redis_keys(redis_url, f"{cache}{other_team.pk}*")
    assert redis_keys(redis_url, *[key.decode() for key in their_limiter_keys])


def test_the_command_deletes_a_team_only_when_told_twice(
    team: Team, other_team: Team, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.RATE_LIMIT_REDIS_URL = settings.RESPONSE_CACHE_REDIS_URL = ""
    ours, theirs = furnish(team), furnish(other_team)
    with pytest.raises(CommandError, match="--yes"):
        call_command("deleteteam", team="acme", stdout=StringIO())
    assert Team.objects.filter(pk=team.pk).exists()

    out = StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("deleteteam", team="acme", yes=True, stdout=out)
    assert "files: 1" in out.getvalue() and "cached_answers: 1" in out.getvalue()
    assert not ours.exists() and theirs.exists()
    assert not Team.objects.filter(name="acme").exists()
    event = AuditEvent.objects.get(action=AuditEvent.Action.TEAM_PURGED)
    assert event.actor == "manage.py deleteteam"


@pytest.mark.django_db(transaction=True)
def test_a_team_deleted_in_the_admin_stops_its_running_answer_before_its_rows_go(
    team: Team, other_team: Team, admin_client: Client
) -> None:
    """The purge deletes conversations through ``conversation_delete``, which asks a
    running answer to stop and waits for it to settle: its stop request must be
    committed, for the process streaming the answer to see it."""
    conversation = Conversation.objects.create(team=team, title="busy")
    running = Message.objects.create(
        conversation=conversation,
        team=team,
        role=Message.Role.ASSISTANT,
        content="",
        status=Message.Status.STREAMING,
    )
    theirs = Message.objects.create(
        conversation=Conversation.objects.create(team=other_team, title="theirs"),
        team=other_team,
        role=Message.Role.ASSISTANT,
        content="",
        status=Message.Status.STREAMING,
    )
    seen: list[str] = []

    def answering_process() -> None:
        """What the process streaming the answer does: reads stop requests, settles."""
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                stop = (
                    Message.objects.filter(pk=running.pk)
                    .values_list("cancel_requested", flat=True)
                    .first()
                )
                if stop is None:
                    seen.append("deleted while streaming")
                    return
                if stop:
                    Message.objects.filter(pk=running.pk).update(status=Message.Status.CANCELLED)
                    seen.append("stopped and settled")
                    return
                time.sleep(0.02)
        finally:
            connection.close()

    thread = threading.Thread(target=answering_process)
    thread.start()
    response = admin_client.post(f"/admin/accounts/team/{team.pk}/delete/", {"post": "yes"})
    thread.join()
    assert response.status_code == 302
    assert seen == ["stopped and settled"]
    assert not Message.objects.filter(pk=running.pk).exists()
    theirs.refresh_from_db()
    assert (theirs.status, theirs.cancel_requested) == (Message.Status.STREAMING, False)
