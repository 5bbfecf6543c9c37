"""Encryption at rest: the codec, the key file, the fields, the migration and rotation."""

from __future__ import annotations

import importlib
import logging
import stat
from io import StringIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.apps import apps as django_apps
from django.core.management import call_command
from django.db import connection

from apps.accounts.models import Team
from apps.chat.models import Conversation, Message, MessageEvent
from apps.core import crypto
from apps.knowledge.models import Document
from apps.knowledge.services import document_ingest
from tests import factories

KEY_1 = Fernet.generate_key().decode()
KEY_2 = Fernet.generate_key().decode()


def raw_column(table: str, column: str, pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE id = %s", [pk])  # noqa: S608
        return str(cursor.fetchone()[0])


def test_text_round_trip_and_the_empty_string(settings: Any) -> None:
    settings.ENCRYPTION_KEYS = [KEY_1]
    token = crypto.encrypt_text("a secret ✓")
    assert token.startswith("gAAAAA") and "secret" not in token
    assert crypto.decrypt_text(token) == "a secret ✓"
    assert crypto.encrypt_text("") == "" and crypto.decrypt_text("") == ""
    assert crypto.is_encrypted(token) and not crypto.is_encrypted("a secret")


def test_the_first_key_encrypts_and_every_key_decrypts(settings: Any) -> None:
    settings.ENCRYPTION_KEYS = [KEY_1]
    old = crypto.encrypt_text("old")
    settings.ENCRYPTION_KEYS = [KEY_2, KEY_1]
    new = crypto.encrypt_text("new")
    assert crypto.decrypt_text(old) == "old" and crypto.decrypt_text(new) == "new"
    settings.ENCRYPTION_KEYS = [KEY_2]
    assert crypto.decrypt_text(new) == "new"
    with pytest.raises(InvalidToken):
        crypto.decrypt_text(old)


def test_an_invalid_key_names_the_setting(settings: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    settings.ENCRYPTION_KEYS = ["not-a-key"]
    with pytest.raises(ImproperlyConfigured, match="RAGTIER_ENCRYPTION_KEYS"):
        crypto.encrypt_text("x")


def test_the_embedded_default_makes_a_key_file_once(
    settings: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings.ENCRYPTION_KEYS = []
    settings.ENCRYPTION_KEY_FILE = tmp_path / "data" / "encryption.key"
    caplog.set_level(logging.WARNING, logger="apps.core.crypto")
    token = crypto.encrypt_text("hello")
    key_file = settings.ENCRYPTION_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert Fernet(key_file.read_text().strip().encode()).decrypt(token.encode()) == b"hello"
    assert crypto.decrypt_text(crypto.encrypt_text("again")) == "again"
    said = [r for r in caplog.records if "created the encryption key file" in r.getMessage()]
    assert len(said) == 1
    assert [p.name for p in key_file.parent.iterdir()] == ["encryption.key"]  # no draft left


@pytest.mark.django_db
def test_message_content_and_events_are_stored_as_tokens(team: Team) -> None:
    conversation = Conversation.objects.create(team=team)
    message = Message.objects.create(
        conversation=conversation, team=team, role="assistant", content="the answer"
    )
    MessageEvent.objects.create(message=message, seq=1, event="delta", data={"text": "the"})
    stored = raw_column("chat_message", "content", message.pk)
    assert stored.startswith("gAAAAA") and "answer" not in stored
    assert "the" not in raw_column("chat_messageevent", "data", message.events.get().pk)
    assert Message.objects.get(pk=message.pk).content == "the answer"
    assert list(Message.objects.values_list("content", flat=True)) == ["the answer"]
    assert MessageEvent.objects.get().data == {"text": "the"}
    # Emptiness is still a filter (the history skips empty turns).
    assert Message.objects.exclude(content="").count() == 1


@pytest.mark.django_db
def test_uploaded_files_are_encrypted_and_still_ingest(team: Team) -> None:
    collection = factories.collection(team=team)
    document = factories.file_document(
        collection=collection, name="notes.txt", data=b"The vault code is kept in clear nowhere."
    )
    with document.source.open("rb") as handle:
        on_disk = handle.read()
    assert b"vault" not in on_disk and on_disk.startswith(b"gAAAAA")
    assert document.status == Document.Status.INDEXED
    assert "vault" in document.chunks.get().text  # chunk text stays searchable


@pytest.mark.django_db
def test_the_migration_encrypts_rows_written_in_clear(team: Team) -> None:
    conversation = Conversation.objects.create(team=team)
    message = Message.objects.create(conversation=conversation, team=team, role="user")
    event = MessageEvent.objects.create(message=message, seq=1, event="delta", data={})
    with connection.cursor() as cursor:
        cursor.execute("UPDATE chat_message SET content = %s WHERE id = %s", ["old", message.pk])
        cursor.execute(
            "UPDATE chat_messageevent SET data = %s WHERE id = %s", ['{"text": "old"}', event.pk]
        )
    migration = importlib.import_module("apps.chat.migrations.0003_message_encrypted_protection")
    editor = SimpleNamespace(connection=connection)  # all the data migration uses of it
    migration.encrypt_rows(django_apps, editor)
    migration.encrypt_rows(django_apps, editor)  # twice: tokens are left as they are
    assert raw_column("chat_message", "content", message.pk).startswith("gAAAAA")
    assert Message.objects.get(pk=message.pk).content == "old"
    assert MessageEvent.objects.get(pk=event.pk).data == {"text": "old"}
    migration.decrypt_rows(django_apps, editor)
    assert raw_column("chat_message", "content", message.pk) == "old"


@pytest.mark.django_db
def test_the_migration_encrypts_files_written_in_clear(team: Team) -> None:
    from django.core.files.base import ContentFile

    collection = factories.collection(team=team)
    document = factories.file_document(collection=collection, name="a.txt", data=b"alpha beta")
    document.source.save("clear.txt", ContentFile(b"alpha beta"), save=True)
    migration = importlib.import_module(
        "apps.knowledge.migrations.0004_document_files_encrypted_protection"
    )
    migration.encrypt_files(django_apps, None)
    document.refresh_from_db()
    with document.source.open("rb") as handle:
        assert crypto.decrypt_bytes(handle.read()) == b"alpha beta"


@pytest.mark.django_db
def test_rotation_then_the_old_key_can_go(team: Team, settings: Any) -> None:
    settings.ENCRYPTION_KEYS = [KEY_1]
    conversation = Conversation.objects.create(team=team)
    messages = [
        Message.objects.create(conversation=conversation, team=team, role="user", content=f"q{i}")
        for i in range(5)
    ]
    MessageEvent.objects.create(message=messages[0], seq=1, event="delta", data={"text": "d"})
    collection = factories.collection(team=team)
    document = factories.file_document(collection=collection, name="r.txt", data=b"rotate me")
    old_file = document.source.name

    settings.ENCRYPTION_KEYS = [KEY_2, KEY_1]
    out = StringIO()
    call_command("rotate_encryption_key", batch=2, stdout=out)
    assert "chat.Message: 2/5" in out.getvalue() and "chat.Message: 5/5" in out.getvalue()
    assert "document files: 1/1" in out.getvalue()

    settings.ENCRYPTION_KEYS = [KEY_2]  # key 1 removed
    assert [m.content for m in Message.objects.order_by("pk")] == [f"q{i}" for i in range(5)]
    assert MessageEvent.objects.get().data == {"text": "d"}
    document.refresh_from_db()
    assert not document.source.storage.exists(old_file)
    with document.source.open("rb") as handle:
        assert crypto.decrypt_bytes(handle.read()) == b"rotate me"
    document_ingest(document_id=document.pk)  # the pipeline reads it under the new key
