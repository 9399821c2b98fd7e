# Code directory names unique per owner (and among the shipped examples), no longer across all users.

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('jobs', '0008_job_name_search'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name='codedirectory',
            name='name',
            field=models.CharField(max_length=64),
        ),
        migrations.AddConstraint(
            model_name='codedirectory',
            constraint=models.UniqueConstraint(fields=('owner', 'name'), name='code_dir_name_unique_per_owner'),
        ),
        migrations.AddConstraint(
            model_name='codedirectory',
            constraint=models.UniqueConstraint(condition=models.Q(('owner__isnull', True)), fields=('name',), name='code_dir_name_unique_among_examples'),
        ),
    ]
