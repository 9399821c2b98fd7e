"""A trigram index for the job list's name search, on PostgreSQL only.

The search is `name__icontains`, which PostgreSQL runs as `UPPER(name::text) LIKE UPPER('%text%')`: no
b-tree serves a pattern with a leading wildcard, so with 100,000 jobs it was a sequential scan (53 ms).
A GIN index of the same expression's trigrams serves it. SQLite has no such index and scans its smaller
lists; the index is not declared on the model because a GinIndex cannot be created there.
"""

import logging

from django.db import DatabaseError, migrations, transaction

INDEX = "job_name_search"
logger = logging.getLogger(__name__)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    try:
        # A savepoint: a role that may not create the extension (pg_trgm is trusted, but creating it needs
        # CREATE on the database; some managed services allow-list extensions) only loses the index.
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {INDEX} ON jobs_trainingjob "
                                  "USING gin ((UPPER(name::text)) gin_trgm_ops)")
    except DatabaseError as error:
        logger.warning("the job list's name search gets no trigram index (%s): it scans the jobs instead", error)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0007_job_list_order'),
    ]

    operations = [
        migrations.RunPython(create, drop),
    ]
