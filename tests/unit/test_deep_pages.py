"""Deep pages of the job list: read ids first, then only the page's rows, in the list's order, on both the
page and the API; and, on PostgreSQL, a name search that an index can serve."""

import importlib
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import TrainingJob
from jobs.pages.paging import IdsFirst
from jobs.submission.access import visible_jobs
from tests.fixtures import api_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def thirty_jobs(make_job, owner):
    now = timezone.now()
    # Two jobs share each creation time, so the id must break the tie the same way on every read.
    return [make_job(owner=owner, name=f"job-{index:02d}", created_at=now - timedelta(minutes=index // 2))
            for index in range(30)]


def test_a_page_read_ids_first_holds_the_same_jobs_in_the_same_order_as_a_plain_slice(thirty_jobs, owner):
    for ordering in (["-created_at", "-id"], ["name"], ["-name"]):
        jobs = visible_jobs(owner).order_by(*ordering)
        for start in (0, 7, 25):
            assert IdsFirst(jobs)[start:start + 10] == list(jobs[start:start + 10])


def test_a_page_takes_two_queries_whatever_its_depth_and_the_rows_come_with_their_joins(thirty_jobs, owner):
    jobs = visible_jobs(owner).order_by("-created_at", "-id")
    with CaptureQueriesContext(connection) as queries:
        page = IdsFirst(jobs)[20:30]
        owners_and_specs = [(job.owner.username, job.spec.name, job.engine_version.engine.name) for job in page]
    assert len(queries.captured_queries) == 2
    assert owners_and_specs[0][0] == "owner" and len(owners_and_specs) == 10


def test_a_job_deleted_between_the_two_reads_is_left_out_of_the_page(thirty_jobs, owner, monkeypatch):
    jobs = visible_jobs(owner).order_by("-created_at", "-id")
    first_five = [job.name for job in jobs[0:5]]
    gone = TrainingJob.objects.get(name=first_five[1])
    real_in_bulk = type(jobs).in_bulk

    def in_bulk_after_a_delete(queryset, ids):
        TrainingJob.objects.filter(pk=gone.pk).delete()
        return real_in_bulk(queryset, ids)

    monkeypatch.setattr(type(jobs), "in_bulk", in_bulk_after_a_delete)
    page = IdsFirst(jobs)[0:5]
    assert [job.name for job in page] == first_five[:1] + first_five[2:]


def test_the_page_and_the_api_walk_the_whole_list_once_each_in_order(thirty_jobs, owner, client):
    newest_first = [job.name for job in sorted(thirty_jobs, key=lambda job: (job.created_at, job.pk), reverse=True)]
    client.force_login(owner)
    on_pages = []
    for number in (1, 2):
        answer = client.get("/", {"page": number})
        on_pages += [job.name for job in answer.context["jobs"]]
    assert on_pages == newest_first
    api = api_client(owner)
    by_api = []
    for offset in (0, 12, 24):
        by_api += [job["name"] for job in api.get("/api/v1/training-jobs", {"limit": 12, "offset": offset}).json()["results"]]
    assert by_api == newest_first
    assert [job["name"] for job in api.get("/api/v1/training-jobs", {"ordering": "name", "offset": 28}).json()["results"]] \
        == ["job-28", "job-29"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigram index is PostgreSQL's")
def test_on_postgresql_the_name_search_can_be_served_by_the_trigram_index(thirty_jobs, owner):
    with connection.cursor() as cursor:
        # A table this small is read whole whatever indexes it has, or walked by created_at's; the question
        # is whether this one fits the query, so every other way is made to cost more (a GIN index is read
        # by a bitmap scan only, and nothing else here can give one).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute("SET LOCAL enable_indexonlyscan = off")
    plan = TrainingJob.objects.filter(name__icontains="job-1").explain()
    assert "job_name_search" in plan, plan


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigram index is PostgreSQL's")
def test_on_postgresql_a_role_that_may_not_create_the_extension_migrates_without_the_index(caplog):
    from django.db import ProgrammingError

    migration = importlib.import_module("jobs.migrations.0008_job_name_search")
    with connection.schema_editor() as editor:
        execute = editor.execute

        def refusing(sql, params=()):
            if "CREATE EXTENSION" in sql:
                raise ProgrammingError('permission denied to create extension "pg_trgm"')
            return execute(sql, params)

        editor.execute = refusing
        migration.create(None, editor)
    assert "gets no trigram index" in caplog.text
    assert TrainingJob.objects.count() == 0  # the transaction is still usable
