# The outbox of end notifications: set with a job's final state, cleared when its notice is delivered.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0010_merge"),
    ]

    operations = [
        migrations.AddField(
            model_name="trainingjob",
            name="end_notice_pending",
            field=models.BooleanField(default=False),
        ),
    ]
