"""A job may choose what the watchdog does once it suspects the job hangs (only warn, or stop it) and how long it
may go on after a rank ended not as 0 (or never fail for it); left empty, each is the default of the day.
"""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0021_job_outputs_limit'),
    ]

    operations = [
        migrations.AddField(
            model_name='trainingjob',
            name='watchdog_action',
            field=models.CharField(blank=True, choices=[('warn', 'Only warn'), ('stop', 'Stop the job')], max_length=8, null=True),
        ),
        migrations.AddField(
            model_name='trainingjob',
            name='rank_exit_grace_seconds',
            field=models.IntegerField(blank=True, null=True, validators=[django.core.validators.MinValueValidator(-1)]),
        ),
    ]
