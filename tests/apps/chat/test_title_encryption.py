"""Conversation titles are sealed like the messages they are made from (the page sets a
title to the head of the first question): encrypted at rest, in clear through the API
to their own team only, and encrypted by the migration when written before it (which
also drops what failed answers' stored errors quoted of the stream)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.chat.models import Conversation, Message
from apps.core.crypto import is_encrypted
from tests.apps.chat.test_protection import database_bytes

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("chat", "0005_message_model_served")]
AFTER = [("chat", "0006_conversation_title_encrypted")]


def stored_title(pk: int) -> str:
    """The column's bytes, as a stolen disk (or a database reader) would see them."""
    table = connection.ops.quote_name(Conversation._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT title FROM {table} WHERE id = %s", [pk])  # noqa: S608
        return str(cursor.fetchone()[0])


def test_a_title_is_encrypted_at_rest_and_read_in_clear_by_its_team_only(
    api: APIClient, api_as: Callable[..., APIClient], other_team: Team
) -> None:
    question = f"Where does QCANARY{uuid.uuid4().hex[:12]} keep the spare key?"
    title = question[:59] + "…"  # what the page sends
    created = api.post("/api/v1/conversations", {"title": title}, format="json")
    assert created.status_code == 201, created.content
    pk = created.json()["id"]
    raw = stored_title(pk)
    assert is_encrypted(raw) and question[:20] not in raw
    if connection.vendor == "sqlite":
        assert question[:20].encode() not in database_bytes()
    assert Conversation.objects.get(pk=pk).title == title
    assert api.get(f"/api/v1/conversations/{pk}").json()["title"] == title
    listed = api.get("/api/v1/conversations").json()
    assert [c["title"] for c in listed["results"]] == [title]
    stranger = api_as(other_team)
    assert stranger.get(f"/api/v1/conversations/{pk}").status_code == 404
    assert stranger.get("/api/v1/conversations").json()["results"] == []


def test_the_migration_encrypts_titles_written_before_it_and_back(team: Team) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    conversations = old.get_model("chat", "Conversation")
    clear = conversations.objects.create(team_id=team.pk, title="Budget for the Q3 layoffs")
    empty = conversations.objects.create(team_id=team.pk, title="")
    leaked = 'malformed JSON in the stream: \'{"choices": [{"delta": {"content": " ACANARY\''
    failed = old.get_model("chat", "Message").objects.create(
        conversation_id=clear.pk,
        team_id=team.pk,
        role="assistant",
        status="failed",
        error={"type": "upstream_error", "code": "inference_protocol_error", "message": leaked},
    )
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        assert is_encrypted(stored_title(clear.pk))
        assert stored_title(empty.pk) == ""
        assert Conversation.objects.get(pk=clear.pk).title == "Budget for the Q3 layoffs"
        error = Message.objects.get(pk=failed.pk).error
        assert error["code"] == "inference_protocol_error" and "ACANARY" not in str(error)
        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE)
        assert stored_title(clear.pk) == "Budget for the Q3 layoffs"
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
