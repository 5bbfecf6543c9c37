"""Builders for test data, through the same services the product uses."""

from __future__ import annotations

from django.core.files.base import ContentFile

from apps.accounts.models import Team
from apps.accounts.services import team_create
from apps.knowledge.models import Collection, Document
from apps.knowledge.services import (
    collection_create,
    document_create_from_file,
    document_create_from_text,
    document_ingest,
)


def team(*, name: str) -> Team:
    return team_create(name=name)


def collection(*, team: Team, name: str = "docs") -> Collection:
    return collection_create(team=team, name=name)


def document(*, collection: Collection, title: str, text: str, fmt: str = "text") -> Document:
    """A document ingested in this process (no queue), through the whole pipeline."""
    accepted = document_create_from_text(
        collection=collection, title=title, text=text, format=fmt, enqueue=False
    )
    return document_ingest(document_id=accepted.document.pk)


def file_document(*, collection: Collection, name: str, data: bytes) -> Document:
    accepted = document_create_from_file(
        collection=collection, upload=ContentFile(data, name=name), enqueue=False
    )
    return document_ingest(document_id=accepted.document.pk)
