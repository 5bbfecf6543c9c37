from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('usage', '0013_model_allow_lists'),
    ]

    operations = [
        migrations.AddField(
            model_name='usagerecord',
            name='dropped_tokens',
            field=models.PositiveIntegerField(default=0, help_text='the tokens the passages and turns left out or summarised would have taken'),
        ),
        migrations.AddField(
            model_name='usagerecord',
            name='route_reason',
            field=models.CharField(blank=True, help_text="why this alias served: the prompt's length, the allow-list, a fallback…", max_length=64),
        ),
        migrations.AddField(
            model_name='usagerecord',
            name='energy_source',
            field=models.CharField(blank=True, help_text='where energy_wh came from: nvml or rapl (measured), estimated (the table)', max_length=16),
        ),
    ]
