"""Key rotation: everything encrypted at rest, re-encrypted under the first key.

Put the new key first in ``RAGTIER_ENCRYPTION_KEYS`` (the old ones after it, so they
still decrypt), run ``manage.py rotate_encryption_key``, then remove the old keys.

The site app holds this because it reaches into every store: the encrypted fields of all
models (:mod:`apps.core.rotation`), uploaded files and the Redis event buffers.
"""

from __future__ import annotations

import logging
from typing import cast

import redis
from django.conf import settings
from django.core.files.base import ContentFile

from apps.chat.event_store import EVENT_BUFFER_PREFIX
from apps.core.crypto import InvalidToken, reencrypt
from apps.core.rotation import Progress, encrypted_fields, rows_reencrypt
from apps.knowledge.models import Document

logger = logging.getLogger(__name__)


def document_files_reencrypt(*, batch: int, progress: Progress) -> int:
    """Each uploaded file written anew under the first key: to a new name, the row moved to
    it, then the old file deleted (a crash leaves the old file, never no file)."""
    documents = Document.objects.exclude(source="").order_by("pk")
    total, done, last = documents.count(), 0, 0
    while page := list(documents.filter(pk__gt=last)[:batch]):
        for document in page:
            source = document.source
            old_name = source.name
            if not old_name:  # excluded above; a FieldFile's name may be None
                continue
            with source.open("rb") as handle:
                token = handle.read()
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
    url = settings.STREAM_BUFFER_REDIS_URL
    if not url:
        return 0
    client = redis.Redis.from_url(url, socket_timeout=settings.REDIS_SOCKET_TIMEOUT)
    done = unreadable = 0
    try:
        for key in client.scan_iter(match=f"{EVENT_BUFFER_PREFIX}*", count=500):
            # bytes: the client does not decode replies (redis-py types them bytes or str)
            items = cast(list[bytes], client.lrange(key, 0, -1))
            with client.pipeline(transaction=True) as pipe:
                for index, item in enumerate(items):
                    if item.startswith(b"["):  # items written in clear stay so
                        continue
                    try:
                        # redis-py types the value as str; it takes bytes as every command does
                        pipe.lset(key, index, reencrypt(item))  # type: ignore[arg-type]
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
