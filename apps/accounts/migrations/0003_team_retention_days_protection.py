import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0002_team_queue_weight"),
    ]

    operations = [
        migrations.AddField(
            model_name="team",
            name="retention_days",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="conversations, messages and their answer events older than this many days are purged (hourly); empty: kept. Usage rows are kept either way",
                null=True,
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
    ]
