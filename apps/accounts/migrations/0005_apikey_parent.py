import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0004_apikey_expires_at_membership_admin'),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='parent',
            field=models.ForeignKey(blank=True, editable=False, help_text='the key that issued this one through the API, if any: revoking it revokes this one too', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='accounts.apikey'),
        ),
    ]
