"""Conversation titles encrypted at rest, like the messages they are made from (the page
sets a title to the head of the first question).

The column becomes text holding Fernet tokens (apps.core.crypto); titles written before
are encrypted here, in batches, with the first of RAGTIER_ENCRYPTION_KEYS (or the
embedded default's key file). Backwards, they are decrypted and cut to the old 200
characters.

Failed answers' stored errors written before this release could quote up to 200
characters of the tier's stream, or the upstream's address: those messages are replaced
by what the app says now (the kind of failure only). Nothing is restored backwards.
"""

from django.db import migrations

import apps.core.fields

BATCH = 500
OLD_MAX_LENGTH = 200


def _rewrite(apps, schema_editor, convert):
    connection = schema_editor.connection
    quote = connection.ops.quote_name
    table = quote(apps.get_model("chat", "conversation")._meta.db_table)
    title = quote("title")
    last = 0
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                f"SELECT id, {title} FROM {table} WHERE id > %s ORDER BY id LIMIT %s",  # noqa: S608
                [last, BATCH],
            )
            rows = cursor.fetchall()
            if not rows:
                break
            for pk, value in rows:
                converted = convert(value)
                if converted != value:
                    cursor.execute(
                        f"UPDATE {table} SET {title} = %s WHERE id = %s",  # noqa: S608
                        [converted, pk],
                    )
            last = rows[-1][0]


def encrypt_titles(apps, schema_editor):
    from apps.core.crypto import encrypt_text, is_encrypted

    def convert(value):
        if not isinstance(value, str) or not value or is_encrypted(value):
            return value
        return encrypt_text(value)

    _rewrite(apps, schema_editor, convert)


def decrypt_titles(apps, schema_editor):
    from apps.core.crypto import decrypt_text, is_encrypted

    def convert(value):
        if value and is_encrypted(value):
            return decrypt_text(value)[:OLD_MAX_LENGTH]
        return value

    _rewrite(apps, schema_editor, convert)


# What the errors quoted, by how their message began → what they say instead.
LEAKY_ERRORS = {
    "malformed JSON in the stream:": "malformed JSON in the stream (its text not kept)",
    "inference tier connection failed:": "The inference tier could not be reached.",
    "inference tier unreachable:": "The inference tier could not be reached.",
    "inference tier timed out:": "The inference tier could not be reached in time.",
}


def scrub_errors(apps, schema_editor):
    message_model = apps.get_model("chat", "Message")
    failed = message_model.objects.filter(status="failed", error__isnull=False)
    for message in failed.only("pk", "error").iterator(chunk_size=BATCH):
        error = message.error
        said = error.get("message") if isinstance(error, dict) else None
        for start, instead in LEAKY_ERRORS.items():
            if isinstance(said, str) and said.startswith(start):
                message_model.objects.filter(pk=message.pk).update(
                    error={**error, "message": instead}
                )
                break


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0005_message_model_served"),
    ]

    operations = [
        # Backwards, titles are decrypted (below) while the column is still text, then it
        # narrows again.
        migrations.AlterField(
            model_name="conversation",
            name="title",
            field=apps.core.fields.EncryptedTextField(blank=True),
        ),
        migrations.RunPython(encrypt_titles, decrypt_titles, elidable=True),
        migrations.RunPython(scrub_errors, migrations.RunPython.noop, elidable=True),
    ]
