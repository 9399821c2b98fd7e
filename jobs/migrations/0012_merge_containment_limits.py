# Joins the containment limits' migration, made beside the others on 0008.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0011_end_notice_outbox"),
        ("jobs", "0009_containment_limits"),
    ]

    operations = []
