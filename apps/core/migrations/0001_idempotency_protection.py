import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("accounts", "0003_team_retention_days_protection"),
    ]

    operations = [
        migrations.CreateModel(
            name="IdempotencyKey",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=255)),
                ("fingerprint", models.CharField(max_length=64)),
                ("status", models.CharField(choices=[("running", "Running"), ("complete", "Complete")], default="running", max_length=16)),
                ("resource_id", models.BigIntegerField(blank=True, help_text="the message or document the first request made", null=True)),
                ("response_status", models.PositiveSmallIntegerField(blank=True, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("expires_at", models.DateTimeField(db_index=True)),
                ("team", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+", to="accounts.team")),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("team", "key"), name="idempotency_unique_team_key")],
            },
        ),
    ]
