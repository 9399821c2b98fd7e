"""A trigram index for the job list's name search, on PostgreSQL only.

The search is `name__icontains`, which PostgreSQL runs as `UPPER(name::text) LIKE UPPER('%text%')`: no
b-tree serves a pattern with a leading wildcard, so with 100,000 jobs it was a sequential scan (53 ms).
A GIN index of the same expression's trigrams serves it. SQLite has no such index and scans its smaller
lists; the index is not declared on the model because a GinIndex cannot be created there.
"""

from django.db import migrations

INDEX = "job_name_search"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    # pg_trgm is a trusted extension (PostgreSQL 13 on): the database's owner may create it.
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {INDEX} ON jobs_trainingjob "
                          "USING gin ((UPPER(name::text)) gin_trgm_ops)")


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
