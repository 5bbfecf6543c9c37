"""Key rotation: everything encrypted at rest, re-encrypted under the first key.

Put the new key first in ``RAGTIER_ENCRYPTION_KEYS`` (the old ones after it, so they
still decrypt), run ``manage.py rotate_encryption_key``, then remove the old keys.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from django.apps import apps
from django.conf import settings
from django.core.files.base import ContentFile
from django.db import models, transaction

from apps.core.crypto import InvalidToken, reencrypt
from apps.core.fields import EncryptedJSONField, EncryptedTextField

logger = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]
"""Called after each batch with what is rotated, how many so far and how many in all."""


def encrypted_fields() -> Iterator[tuple[type[models.Model], list[str]]]:
    """Every model with encrypted fields, and those fields' names."""
    for model in apps.get_models():
        names = [
            field.name
            for field in model._meta.concrete_fields
            if isinstance(field, (EncryptedTextField, EncryptedJSONField))
        ]
        if names:
            yield model, names


def rows_reencrypt(
    *, model: type[models.Model], fields: list[str], batch: int, progress: Progress
) -> int:
    """Each row read (any key decrypts) and written back (the first key encrypts), one
    locked batch per transaction."""
    label = model._meta.label
    total, done, last = model._default_manager.count(), 0, 0
    while True:
        with transaction.atomic():
            rows = list(
                model._default_manager.select_for_update()
                .filter(pk__gt=last)
                .order_by("pk")
                .only("pk", *fields)[:batch]
            )
            if not rows:
                break
            model._default_manager.bulk_update(rows, fields)
        last, done = rows[-1].pk, done + len(rows)
        progress(label, done, total)
    return done


def document_files_reencrypt(*, batch: int, progress: Progress) -> int:
    """Each uploaded file written anew under the first key: to a new name, the row moved to
    it, then the old file deleted (a crash leaves the old file, never no file)."""
    from apps.knowledge.models import Document

    documents = Document.objects.exclude(source="").order_by("pk")
    total, done, last = documents.count(), 0, 0
    while page := list(documents.filter(pk__gt=last)[:batch]):
        for document in page:
            source = document.source
            with source.open("rb") as handle:
                token = handle.read()
            old_name = source.name
            # The name alone: the field's upload_to puts it in this month's folder.
            new_name = old_name.rsplit("/", 1)[-1]
            source.save(new_name, ContentFile(reencrypt(token)), save=False)
            Document.objects.filter(pk=document.pk).update(source=source.name)
            source.storage.delete(old_name)
        last, done = page[-1].pk, done + len(page)
        progress("document files", done, total)
    return done


def event_buffers_reencrypt(*, progress: Progress) -> int:
    """The answer events kept in Redis, item by item, in place."""
    import redis

    from apps.chat.events import EVENT_BUFFER_PREFIX

    url = settings.STREAM_BUFFER_REDIS_URL
    if not url:
        return 0
    client = redis.Redis.from_url(url, socket_timeout=settings.REDIS_SOCKET_TIMEOUT)
    done = unreadable = 0
    try:
        for key in client.scan_iter(match=f"{EVENT_BUFFER_PREFIX}*", count=500):
            items = client.lrange(key, 0, -1)
            with client.pipeline(transaction=True) as pipe:
                for index, item in enumerate(items):
                    if item.startswith(b"["):  # items written in clear stay so
                        continue
                    try:
                        pipe.lset(key, index, reencrypt(item))
                    except InvalidToken:  # under a key already removed: it expires as is
                        unreadable += 1
                pipe.execute()
            done += 1
            if done % 500 == 0:
                progress("Redis event buffers", done, done)
    finally:
        client.close()
    if unreadable:
        logger.warning("%d Redis event items are under no configured key; left", unreadable)
    progress("Redis event buffers", done, done)
    return done


def encryption_rotate(*, progress: Progress, batch: int | None = None) -> int:
    """Everything encrypted at rest, re-encrypted under the first key; how many items."""
    size = batch or settings.ENCRYPTION_ROTATE_BATCH
    count = sum(
        rows_reencrypt(model=model, fields=fields, batch=size, progress=progress)
        for model, fields in encrypted_fields()
    )
    count += document_files_reencrypt(batch=size, progress=progress)
    return count + event_buffers_reencrypt(progress=progress)
