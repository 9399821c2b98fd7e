"""Each job keeps the outputs size limit it was created with, as it keeps its log cap: an administrator's later
change of the launcher defaults no longer changes what a job already submitted keeps when it ends.

The jobs not yet ended when this runs keep the limit in force now (the one they would have been held to).
"""

from django.db import migrations, models

# Pending, Creating, Running, Terminating: their outputs are still to be collected.
UNFINISHED = ["Pending", "Creating", "Running", "Terminating"]
DEFAULT_OUTPUTS_MAX_BYTES = 1024**3


def keep_the_limit_in_force(apps, schema_editor):
    defaults = apps.get_model("jobs", "LauncherDefaults").objects.filter(pk=1).first()
    limit = defaults.outputs_max_bytes if defaults is not None else DEFAULT_OUTPUTS_MAX_BYTES
    apps.get_model("jobs", "TrainingJob").objects.filter(status__in=UNFINISHED, outputs_max_bytes__isnull=True).update(
        outputs_max_bytes=limit)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0020_checkpoints'),
    ]

    operations = [
        migrations.AddField(
            model_name='trainingjob',
            name='outputs_max_bytes',
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='launcherdefaults',
            name='outputs_max_bytes',
            field=models.PositiveBigIntegerField(default=1073741824, help_text="Bytes of a job's output directory (train_url on worker-0) the console keeps when the job ends. Applies to jobs created after the change."),
        ),
        migrations.RunPython(keep_the_limit_in_force, migrations.RunPython.noop),
    ]
