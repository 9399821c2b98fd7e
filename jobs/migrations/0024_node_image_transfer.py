"""What bringing the engine images to a node last did (jobs.runtime.image_prefetch), shown on its admin page."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0023_console_process'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='image_transfer',
            field=models.JSONField(blank=True, default=dict, editable=False),
        ),
    ]
