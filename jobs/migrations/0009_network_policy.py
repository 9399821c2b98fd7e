from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0008_job_name_search"),
    ]

    operations = [
        migrations.AddField(
            model_name="launcherdefaults",
            name="job_allowed_destinations",
            field=models.TextField(
                blank=True,
                help_text="Where a job's containers may connect beyond the job's own workers, one destination a line: "
                          "an address or network, then optionally a port or a range, e.g. '10.20.0.0/16' (object "
                          "storage), '192.0.2.10 5000' (a registry), '192.0.2.53 53' (DNS). Everything else, the "
                          "console and other jobs' nodes included, is refused. Applies to jobs started after the change.",
            ),
        ),
    ]
