"""Key rotation's generic part: every encrypted model field, re-encrypted under the first
key. What only a feature app knows of (its files, its Redis items) is rotated by
:mod:`apps.site.rotation`, which runs this too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from django.apps import apps
from django.db import models, transaction

from apps.core.fields import EncryptedJSONField, EncryptedTextField

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
