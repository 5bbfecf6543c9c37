"""Uploaded document files encrypted at rest (apps.core.crypto), in place of their clear
copies; backwards, decrypted again. Chunk text stays in clear: the indexes search it."""

from django.core.files.base import ContentFile
from django.db import migrations


def _rewrite(apps, convert):
    Document = apps.get_model("knowledge", "Document")
    for document in Document.objects.exclude(source="").order_by("pk").iterator(chunk_size=200):
        source = document.source
        if not source.storage.exists(source.name):
            continue
        with source.open("rb") as handle:
            data = handle.read()
        converted = convert(data)
        if converted is None:
            continue
        old_name = source.name
        source.save(old_name.rsplit("/", 1)[-1], ContentFile(converted), save=False)
        Document.objects.filter(pk=document.pk).update(source=source.name)
        source.storage.delete(old_name)


def encrypt_files(apps, schema_editor):
    from apps.core.crypto import encrypt_bytes, is_encrypted

    _rewrite(apps, lambda data: None if is_encrypted(data) else encrypt_bytes(data))


def decrypt_files(apps, schema_editor):
    from apps.core.crypto import decrypt_bytes, is_encrypted

    _rewrite(apps, lambda data: decrypt_bytes(data) if is_encrypted(data) else None)


class Migration(migrations.Migration):

    dependencies = [
        ("knowledge", "0003_ingestion_dispatch"),
    ]

    operations = [
        migrations.RunPython(encrypt_files, decrypt_files, elidable=True),
    ]
