"""Writes for documents: accept (with every limit checked up front), delete, re-ingest."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import PurePath

import numpy as np
from django.conf import settings
from django.core.files.base import ContentFile, File
from django.db import IntegrityError, transaction

from apps.accounts.selectors import Caller
from apps.core.audit import SYSTEM, Actor, audit_record
from apps.core.crypto import encrypt_bytes
from apps.core.exceptions import InvalidRequest, PayloadTooLarge, UnsupportedFileType
from apps.core.models import AuditEvent
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services.dispatch import ingestion_enqueue
from apps.knowledge.services.indexing import collection_index_append
from apps.knowledge.services.stages import document_release
from apps.knowledge.signals import team_documents_deleted
from retrieval import UnsupportedDocument, detect_media_type
from retrieval.parsing import MARKDOWN, PDF, TEXT

logger = logging.getLogger(__name__)

TEXT_FORMATS = {"text": TEXT, "markdown": MARKDOWN}


@dataclass(frozen=True)
class Accepted:
    document: Document
    created: bool
    """False when the same content was already in the collection."""


def document_create_from_file(
    *,
    collection: Collection,
    upload: File[bytes],
    title: str = "",
    enqueue: bool = True,
    caller: Caller | None = None,
) -> Accepted:
    """Accept an uploaded file after every cheap check: size, type (extension and magic
    bytes), a text file's encoding and length. A PDF is not opened here: the worker's
    bounded parse stage counts its pages (``too_many_pages``) and reads it, so that no
    file costs the web process more than a pass over its bytes.

    ``caller``: the uploader a new document records (its user and key), so a member may
    delete their own; None (the ``ingest`` command) records no one. Content already in the
    collection keeps its first uploader."""
    if upload.size is not None and upload.size > settings.MAX_UPLOAD_BYTES:
        raise PayloadTooLarge(
            f"The file is {upload.size} bytes; the limit is {settings.MAX_UPLOAD_BYTES}.",
            code="file_too_large",
            param="file",
        )
    filename = PurePath(upload.name or "upload").name
    data = upload.read(settings.MAX_UPLOAD_BYTES + 1)
    if len(data) > settings.MAX_UPLOAD_BYTES:
        raise PayloadTooLarge(
            f"The file is larger than the limit of {settings.MAX_UPLOAD_BYTES} bytes.",
            code="file_too_large",
            param="file",
        )
    if not data:
        raise InvalidRequest("The file is empty.", code="empty_file", param="file")
    try:
        media_type = detect_media_type(filename, data[:8])
    except UnsupportedDocument as exc:
        raise UnsupportedFileType(str(exc), param="file") from exc
    if media_type != PDF:
        _check_text(data)
    title = title.strip() or PurePath(filename).stem
    return _document_accept(
        collection=collection,
        data=data,
        media_type=media_type,
        title=title,
        filename=filename,
        enqueue=enqueue,
        caller=caller,
    )


def document_create_from_text(
    *,
    collection: Collection,
    title: str,
    text: str,
    format: str = "text",
    enqueue: bool = True,
    caller: Caller | None = None,
) -> Accepted:
    """Accept a text or Markdown document; ``caller`` as for :func:`document_create_from_file`."""
    if len(text) > settings.MAX_DOCUMENT_CHARS:
        raise PayloadTooLarge(
            f"The text has {len(text)} characters; the limit is {settings.MAX_DOCUMENT_CHARS}.",
            code="document_too_large",
            param="text",
        )
    if not text.strip():
        raise InvalidRequest("The text is empty.", code="empty_document", param="text")
    media_type = TEXT_FORMATS[format]
    suffix = ".md" if media_type == MARKDOWN else ".txt"
    return _document_accept(
        collection=collection,
        data=text.encode("utf-8"),
        media_type=media_type,
        title=title.strip(),
        filename=f"{_slug(title)}{suffix}",
        enqueue=enqueue,
        caller=caller,
    )


def _check_text(data: bytes) -> None:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UnsupportedFileType(
            "Text files must be UTF-8 encoded.", code="invalid_encoding", param="file"
        ) from None
    if len(text) > settings.MAX_DOCUMENT_CHARS:
        raise PayloadTooLarge(
            f"The file has {len(text)} characters; the limit is {settings.MAX_DOCUMENT_CHARS}.",
            code="document_too_large",
            param="file",
        )


def _slug(title: str) -> str:
    cleaned = "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")
    return cleaned[:80] or "document"


def _document_accept(
    *,
    collection: Collection,
    data: bytes,
    media_type: str,
    title: str,
    filename: str,
    enqueue: bool,
    caller: Caller | None,
) -> Accepted:
    content_hash = hashlib.sha256(data).hexdigest()
    existing = Document.objects.filter(collection=collection, content_hash=content_hash).first()
    if existing is not None:
        return _existing(existing)
    document = Document(
        team_id=collection.team_id,
        collection=collection,
        user=caller.user if caller is not None else None,
        api_key=caller.api_key if caller is not None else None,
        tag=caller.tag if caller is not None else "",
        title=title[:300],
        filename=filename[:300],
        media_type=media_type,
        size_bytes=len(data),
        content_hash=content_hash,
    )
    try:
        with transaction.atomic():
            # Encrypted at rest; the chunks made from it stay searchable (see the README).
            document.source.save(filename, ContentFile(encrypt_bytes(data)), save=False)
            document.save()
            if enqueue:
                ingestion_enqueue(document=document)
    except IntegrityError:
        # The same content arrived concurrently: the first one wins, this one replays it.
        document.source.delete(save=False)
        return _existing(Document.objects.get(collection=collection, content_hash=content_hash))
    return Accepted(document, created=True)


def _existing(document: Document) -> Accepted:
    if document.status == Document.Status.FAILED:
        document = document_reingest(document=document)
    return Accepted(document, created=False)


def document_delete(*, document: Document, actor: Actor = SYSTEM) -> None:
    """Remove the document, its chunks and their vectors, in one transaction, and say so
    in the audit log.

    A document deleted while it is being embedded is charged for the tokens spent so far,
    and its quota reservation is settled on them rather than left to expire.
    """
    source = document.source
    with transaction.atomic():
        current = Document.objects.select_for_update().filter(pk=document.pk).first()
        if current is None:
            return  # deleted meanwhile
        document_release(document=current)
        chunk_ids = list(Chunk.objects.filter(document=document).values_list("pk", flat=True))
        if chunk_ids and current.status == Document.Status.INDEXED:
            _index_delete(collection_id=document.collection_id, chunk_ids=chunk_ids)
        document.delete()
        audit_record(
            action=AuditEvent.Action.DOCUMENT_DELETED,
            actor=actor,
            team=current.team,
            target=f"document {current.pk}",
            detail={"collection": current.collection_id, "chunks": len(chunk_ids)},
        )
        transaction.on_commit(lambda: source.delete(save=False))
        # Its index version moved, so cached answers quoting it miss; their owner drops them.
        transaction.on_commit(
            lambda: team_documents_deleted.send(sender=Document, team_id=document.team_id)
        )


def _index_delete(*, collection_id: int, chunk_ids: list[int]) -> None:
    """Tombstones for the chunks, in a delta of their own."""
    dimension = settings.EMBEDDING_DIMENSION
    collection_index_append(
        collection_id=collection_id,
        ids=np.zeros(0, dtype=np.int64),
        vectors=np.zeros((0, dimension), dtype=np.float32),
        tombstones=np.array(chunk_ids, dtype=np.int64),
    )


def document_reingest(*, document: Document) -> Document:
    """Take the document out of the index and run the whole pipeline again."""
    with transaction.atomic():
        document = Document.objects.select_for_update().get(pk=document.pk)
        chunk_ids = list(Chunk.objects.filter(document=document).values_list("pk", flat=True))
        if chunk_ids and document.status == Document.Status.INDEXED:
            _index_delete(collection_id=document.collection_id, chunk_ids=chunk_ids)
        Chunk.objects.filter(document=document).delete()
        document_release(document=document)
        document.reservation = None  # a new run reserves afresh
        document.status = Document.Status.QUEUED
        document.stage = Document.Stage.PARSE
        document.progress = 0
        document.chunk_count = 0
        document.embedding_tokens = 0
        document.parsed = None
        document.error = ""
        document.attempts = 0
        document.indexed_at = None
        document.save()
        ingestion_enqueue(document=document)
    return document
