"""Message content and reasoning, and stored answer events, encrypted at rest.

The columns become text holding Fernet tokens (apps.core.crypto); rows written before are
encrypted here, in batches, with the first of RAGTIER_ENCRYPTION_KEYS (or the embedded
default's key file). Backwards, they are decrypted again.
"""

from django.db import migrations

import apps.core.fields

BATCH = 500
COLUMNS = {"message": ("content", "reasoning"), "messageevent": ("data",)}


def _rewrite(apps, schema_editor, convert):
    connection = schema_editor.connection
    quote = connection.ops.quote_name
    for model_name, columns in COLUMNS.items():
        table = quote(apps.get_model("chat", model_name)._meta.db_table)
        selected = ", ".join(quote(column) for column in columns)
        assignments = ", ".join(f"{quote(column)} = %s" for column in columns)
        last = 0
        with connection.cursor() as cursor:
            while True:
                cursor.execute(
                    f"SELECT id, {selected} FROM {table} WHERE id > %s ORDER BY id LIMIT %s",  # noqa: S608
                    [last, BATCH],
                )
                rows = cursor.fetchall()
                if not rows:
                    break
                for pk, *values in rows:
                    converted = [convert(value) for value in values]
                    if converted != values:
                        cursor.execute(
                            f"UPDATE {table} SET {assignments} WHERE id = %s",  # noqa: S608
                            [*converted, pk],
                        )
                last = rows[-1][0]


def encrypt_rows(apps, schema_editor):
    from apps.core.crypto import encrypt_text, is_encrypted

    def convert(value):
        if value is None or not isinstance(value, str) or not value or is_encrypted(value):
            return value
        return encrypt_text(value)

    _rewrite(apps, schema_editor, convert)


def decrypt_rows(apps, schema_editor):
    from apps.core.crypto import decrypt_text, is_encrypted

    def convert(value):
        return decrypt_text(value) if value and is_encrypted(value) else value

    _rewrite(apps, schema_editor, convert)


class Migration(migrations.Migration):

    dependencies = [
        ("chat", "0002_message_queue_ms"),
    ]

    operations = [
        migrations.AlterField(
            model_name="message",
            name="content",
            field=apps.core.fields.EncryptedTextField(blank=True),
        ),
        migrations.AlterField(
            model_name="message",
            name="reasoning",
            field=apps.core.fields.EncryptedTextField(blank=True),
        ),
        migrations.AlterField(
            model_name="messageevent",
            name="data",
            field=apps.core.fields.EncryptedJSONField(),
        ),
        migrations.RunPython(encrypt_rows, decrypt_rows, elidable=True),
    ]
