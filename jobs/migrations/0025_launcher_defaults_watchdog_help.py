"""The launcher defaults say that a job which chose no watchdog time or action of its own follows theirs as it runs."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0024_node_image_transfer'),
    ]

    operations = [
        migrations.AlterField(
            model_name='launcherdefaults',
            name='watchdog_may_stop',
            field=models.BooleanField(default=False, help_text='Let the console stop a job the watchdog marks as suspected hung, for jobs that chose nothing themselves (a job may ask to be stopped, or only warned).'),
        ),
        migrations.AlterField(
            model_name='launcherdefaults',
            name='watchdog_seconds',
            field=models.PositiveIntegerField(default=1800, help_text='Seconds a rank may print nothing before its job is marked suspected hung (0: no watchdog). A job that chose no time of its own follows this value while it runs, a change included.'),
        ),
    ]
