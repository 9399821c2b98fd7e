"""What is known of the console's Celery processes: when each was last seen alive, its last restart for silence."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0022_job_watchdog_action_rank_exit_grace'),
    ]

    operations = [
        migrations.CreateModel(
            name='ConsoleProcess',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(choices=[('beat', 'Scheduler (Celery beat)'), ('worker-runs', 'Worker of the runs queue'), ('worker-control', 'Worker of the control queue')], max_length=20, unique=True)),
                ('seen_at', models.DateTimeField(blank=True, null=True)),
                ('restarted_at', models.DateTimeField(blank=True, null=True)),
                ('restart_silence_seconds', models.PositiveIntegerField(blank=True, null=True)),
                ('restarts', models.PositiveIntegerField(default=0)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
    ]
