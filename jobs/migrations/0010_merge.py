# Joins the migrations that were made side by side on 0008.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0009_code_dir_names_per_owner"),
        ("jobs", "0009_network_policy"),
    ]

    operations = []
