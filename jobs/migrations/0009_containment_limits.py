import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0008_job_name_search"),
    ]

    operations = [
        migrations.AddField(
            model_name="resourcespec",
            name="disk_gb",
            field=models.PositiveIntegerField(
                default=50,
                help_text="The most disk one worker may fill on its node (its home and its container's own files); "
                          "a worker past it is stopped.",
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
    ]
