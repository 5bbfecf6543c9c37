"""Index segments: a collection's index is a base plus deltas. Every index written before
was a whole one, so its base is its version."""

from django.db import migrations, models


def _base_is_version(apps, schema_editor):
    Collection = apps.get_model("knowledge", "Collection")
    Collection.objects.update(index_base=models.F("index_version"))


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0004_document_files_encrypted_protection")]

    operations = [
        migrations.AddField(
            model_name="collection",
            name="index_base",
            field=models.PositiveIntegerField(default=0, editable=False),
        ),
        migrations.RunPython(_base_is_version, migrations.RunPython.noop),
    ]
