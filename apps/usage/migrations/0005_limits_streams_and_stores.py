import uuid

import django.db.models.deletion
from django.db import migrations, models


def forwards(apps, schema_editor):
    """Give every reservation its own token, and name the limits whose buckets it drew on
    (it used to list bucket row ids)."""
    Reservation = apps.get_model("usage", "Reservation")
    TokenBucket = apps.get_model("usage", "TokenBucket")
    limit_of = dict(TokenBucket.objects.values_list("pk", "limit_id"))
    for reservation in Reservation.objects.all():
        reservation.token = uuid.uuid4()
        reservation.buckets = [limit_of[pk] for pk in reservation.buckets if pk in limit_of]
        reservation.save(update_fields=["token", "buckets"])


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0001_initial'),
        ('usage', '0004_limit_quotacounter_reservation_tokenbucket_and_more'),
    ]

    operations = [
        migrations.AddField(
            model_name='limit',
            name='max_concurrent_streams',
            field=models.PositiveIntegerField(blank=True, help_text='answers being generated at once', null=True),
        ),
        migrations.AddField(
            model_name='limit',
            name='max_tokens',
            field=models.PositiveIntegerField(blank=True, help_text="cap on a request's max_tokens, under each model's own cap", null=True),
        ),
        migrations.CreateModel(
            name='StreamCounter',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('open', models.IntegerField(default=0)),
                ('limit', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='streams', to='usage.limit')),
            ],
        ),
        migrations.AddField(
            model_name='reservation',
            name='api_key',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='reservations', to='accounts.apikey'),
        ),
        migrations.AddField(
            model_name='reservation',
            name='kind',
            field=models.CharField(choices=[('chat', 'Chat'), ('embedding', 'Embedding')], default='chat', max_length=16),
        ),
        migrations.AddField(
            model_name='reservation',
            name='token',
            field=models.UUIDField(editable=False, null=True),
        ),
        migrations.AddField(
            model_name='reservation',
            name='store',
            field=models.CharField(choices=[('database', 'Database'), ('redis', 'Redis')], default='database', max_length=16),
        ),
        migrations.AddField(
            model_name='reservation',
            name='slots',
            field=models.JSONField(default=list, help_text='ids of the limits whose stream slot it holds'),
        ),
        migrations.AlterField(
            model_name='reservation',
            name='buckets',
            field=models.JSONField(default=list, help_text='ids of the limits whose bucket it drew on'),
        ),
        migrations.AddField(
            model_name='reservation',
            name='actual_tokens',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='reservation',
            name='remote_pending',
            field=models.BooleanField(default=False, help_text='settled here, but Redis was unreachable: refund it later'),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='reservation',
            name='token',
            field=models.UUIDField(default=uuid.uuid4, editable=False, unique=True),
        ),
        migrations.AddIndex(
            model_name='reservation',
            index=models.Index(condition=models.Q(('settled_at__isnull', True)), fields=['expires_at'], name='reservation_open'),
        ),
        migrations.AddIndex(
            model_name='reservation',
            index=models.Index(condition=models.Q(('remote_pending', True)), fields=['id'], name='reservation_remote'),
        ),
    ]
