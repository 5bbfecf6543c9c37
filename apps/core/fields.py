"""Model fields whose values are encrypted at rest (:mod:`apps.core.crypto`).

The column holds a Fernet token as text; the model attribute holds the clear value, which
is encrypted on every write and decrypted on every read. Tokens are randomised, so the
database can filter only on emptiness (the empty string is stored as is).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.expressions import Combinable, Expression

from apps.core.crypto import decrypt_text, encrypt_text


def column_of(field: models.Field[Any, Any]) -> str:
    """A concrete field's column name (Django's ``column`` is None only for a field that
    has no column of its own, which no statement names)."""
    if field.column is None:
        raise ImproperlyConfigured(f"{field} has no column")
    return field.column


class EncryptedTextField(models.TextField[str | Combinable, str]):
    description = "Text, encrypted at rest"

    def from_db_value(
        self, value: str | None, expression: Expression | None, connection: BaseDatabaseWrapper
    ) -> str | None:
        return None if value is None else decrypt_text(value)

    def get_prep_value(self, value: Any) -> str | None:
        value = super().get_prep_value(value)
        return None if value is None else encrypt_text(value)


class EncryptedJSONField(models.Field[Any, Any]):
    """A JSON value (``json.dumps``-able), encrypted at rest in a text column."""

    description = "JSON, encrypted at rest"

    def get_internal_type(self) -> str:
        return "TextField"

    def from_db_value(
        self, value: str | None, expression: Expression | None, connection: BaseDatabaseWrapper
    ) -> Any:
        return None if value is None else json.loads(decrypt_text(value))

    def get_prep_value(self, value: Any) -> str | None:
        if value is None and self.null:
            return None
        return encrypt_text(json.dumps(value, ensure_ascii=False))

    def value_to_string(self, obj: models.Model) -> str:
        return json.dumps(self.value_from_object(obj), ensure_ascii=False)
