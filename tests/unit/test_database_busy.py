"""A database that cannot take a write: a stop or a submission is refused with a 503, Retry-After and a message
where the user acted, nothing half-done, and recorded once sent again; the stop's task tries again.

The lock is real: a second connection to the test database holds the write lock, as another process's long write
would (on SQLite, BEGIN IMMEDIATE on the same file; on PostgreSQL, a lock on the jobs' table that lets reads
through), and the console's own connection waits only a fifth of a second for it instead of its 30.
"""

import sqlite3

import pytest
from celery.signals import task_retry
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import connection

from console.database_busy import RETRY_AFTER_SECONDS, busy_message
from jobs.models import JobStatus, LauncherDefaults, TrainingJob
from jobs.tasks import stop_job
from tests.fixtures import api_client, job_body, password_of

pytestmark = pytest.mark.django_db(transaction=True)

class WriteLock:
    """The write lock, held from a connection of the test's own until release(); on PostgreSQL, on `tables`."""

    def __init__(self, tables: tuple[str, ...]):
        if connection.vendor == "postgresql":
            import psycopg

            self.holder = psycopg.connect(**connection.get_connection_params())
            self.holder.execute(f"LOCK TABLE {', '.join(tables)} IN EXCLUSIVE MODE")
        else:
            self.holder = sqlite3.connect(connection.settings_dict["NAME"], timeout=0, isolation_level=None,
                                          check_same_thread=False)
            self.holder.execute("BEGIN IMMEDIATE")
        self.held = True

    def release(self) -> None:
        if self.held:
            self.holder.rollback()
            self.holder.close()
            self.held = False


@pytest.fixture
def short_wait_for_locks():
    """The console's connection gives up on a lock after 0.2 s (SQLite's busy timeout, PostgreSQL's lock_timeout)."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    saved = dict(options)
    if connection.vendor == "postgresql":
        options["options"] = "-c lock_timeout=200"
    else:
        options["timeout"] = 0.2
    connection.close()
    yield
    options.clear()
    options.update(saved)
    connection.close()


@pytest.fixture
def lock(short_wait_for_locks):
    # The launcher defaults' row, made at the console's first start (pages read it, and would make it if missing).
    LauncherDefaults.current()
    held = None

    def take(tables: tuple[str, ...] = (TrainingJob._meta.db_table,)) -> WriteLock:
        nonlocal held
        held = WriteLock(tables)
        return held

    yield take
    if held is not None:
        held.release()


def assert_refused_for_now(response) -> None:
    assert response.status_code == 503, response.content[:500]
    assert response["Retry-After"] == str(RETRY_AFTER_SECONDS)


def stop_events(job) -> list[str]:
    return list(job.events.filter(kind__in=["state:Terminating", "state:Terminated"]).values_list("message", flat=True))


def test_a_stop_on_the_job_page_while_the_database_is_locked_is_refused_on_that_page_and_recorded_when_sent_again(
        client, owner, make_job, lock):
    job = make_job(owner=owner, status=JobStatus.RUNNING)
    client.force_login(owner)
    held = lock()

    refused = client.post(f"/jobs/{job.pk}/stop", {"next": f"/jobs/{job.pk}"})

    assert_refused_for_now(refused)
    page = refused.content.decode()
    assert busy_message() in page
    assert f'action="/jobs/{job.pk}/stop"' in page, "the job's page again, its stop button there to press again"
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and stop_events(job) == []

    held.release()
    sent_again = client.post(f"/jobs/{job.pk}/stop", {"next": f"/jobs/{job.pk}"})

    assert sent_again.status_code == 302
    job.refresh_from_db()
    assert job.status == JobStatus.TERMINATING
    assert stop_events(job) == ["Stop requested by owner"]


def test_a_stop_through_the_api_while_the_database_is_locked_is_a_json_503_and_recorded_when_sent_again(
        api, make_job, owner, lock):
    job = make_job(owner=owner, status=JobStatus.CREATING)
    assert api.get(f"/api/v1/training-jobs/{job.pk}").status_code == 200  # the token's use noted before the lock
    held = lock()

    refused = api.post(f"/api/v1/training-jobs/{job.pk}/stop")

    assert_refused_for_now(refused)
    assert refused.json() == {"detail": busy_message()}
    job.refresh_from_db()
    assert job.status == JobStatus.CREATING and stop_events(job) == []

    held.release()
    sent_again = api.post(f"/api/v1/training-jobs/{job.pk}/stop")

    assert sent_again.status_code == 200 and sent_again.json()["status"] == JobStatus.TERMINATING
    assert stop_events(TrainingJob.objects.get(pk=job.pk)) == ["Stop requested by owner"]


def test_a_submission_from_the_form_while_the_database_is_locked_keeps_what_was_typed_and_creates_nothing(
        client, owner, catalogue, lock):
    client.force_login(owner)
    form = {"name": "typed-by-hand", "engine": "MPI", "code_dir": "gpu-train", "boot_file": "train.py", "spec": "cpu",
            "node_count": "2", "param_name": "steps", "param_value": "10"}
    held = lock()

    refused = client.post("/jobs/new", form)

    assert_refused_for_now(refused)
    page = refused.content.decode()
    assert busy_message() in page
    assert 'value="typed-by-hand"' in page, "the form again, as it was typed"
    assert not TrainingJob.objects.exists()

    held.release()
    assert client.post("/jobs/new", form).status_code == 302
    assert list(TrainingJob.objects.values_list("name", flat=True)) == ["typed-by-hand"]


def test_a_submission_through_the_api_while_the_database_is_locked_is_a_503_and_its_retry_creates_the_job_once(
        api, catalogue, lock):
    assert api.get("/api/v1/training-jobs").status_code == 200
    key = {"HTTP_IDEMPOTENCY_KEY": "retry-me"}
    held = lock()

    refused = api.post("/api/v1/training-jobs", job_body(), format="json", **key)

    assert_refused_for_now(refused)
    assert refused.json() == {"detail": busy_message()}
    assert not TrainingJob.objects.exists()

    held.release()
    created = api.post("/api/v1/training-jobs", job_body(), format="json", **key)
    replayed = api.post("/api/v1/training-jobs", job_body(), format="json", **key)

    assert (created.status_code, replayed.status_code) == (201, 200)
    assert TrainingJob.objects.count() == 1


def test_a_bulk_stop_from_the_list_while_the_database_is_locked_stops_none_of_the_jobs_and_leads_back_to_the_list(
        client, owner, make_job, lock):
    jobs = [make_job(owner=owner, name=f"job-{index}", status=JobStatus.RUNNING) for index in range(3)]
    client.force_login(owner)
    held = lock()

    refused = client.post("/jobs/bulk", {"action": "stop", "ids": [job.pk for job in jobs], "next": "/?state=Running"})

    assert_refused_for_now(refused)
    page = refused.content.decode()
    assert busy_message() in page and 'href="/?state=Running"' in page
    assert set(TrainingJob.objects.values_list("status", flat=True)) == {JobStatus.RUNNING}

    held.release()
    assert client.post("/jobs/bulk", {"action": "stop", "ids": [job.pk for job in jobs]}).status_code == 302
    assert set(TrainingJob.objects.values_list("status", flat=True)) == {JobStatus.TERMINATING}


def test_an_admin_stop_of_several_jobs_while_the_database_is_locked_leaves_every_job_as_it_was_and_says_so(
        admin_client, make_job, lock):
    jobs = [make_job(name=f"job-{index}", status=JobStatus.RUNNING) for index in range(2)]
    action = {"action": "stop_selected", "_selected_action": [job.pk for job in jobs], "index": "0"}
    held = lock()

    refused = admin_client.post("/admin/jobs/trainingjob/", action)

    assert_refused_for_now(refused)
    page = refused.content.decode()
    assert busy_message() in page and 'href="/admin/jobs/trainingjob/"' in page
    assert set(TrainingJob.objects.values_list("status", flat=True)) == {JobStatus.RUNNING}

    held.release()
    assert admin_client.post("/admin/jobs/trainingjob/", action).status_code == 302
    assert set(TrainingJob.objects.values_list("status", flat=True)) == {JobStatus.TERMINATING}
    assert [stop_events(job) for job in jobs] == [["Stop requested by admin"]] * 2


def test_signing_in_while_the_database_is_locked_is_a_503_not_a_server_error(client, owner, lock):
    lock((get_user_model()._meta.db_table, Session._meta.db_table))
    refused = client.post("/accounts/login/", {"username": "owner", "password": password_of("owner")})
    assert_refused_for_now(refused)
    assert busy_message() in refused.content.decode()


def test_the_stop_task_that_meets_a_locked_database_is_tried_again_and_ends_the_containers_once_it_is_free(
        make_job, lock):
    job = make_job(node_count=1, status=JobStatus.TERMINATING, sealed_ssh_key="sealed")
    held = lock()
    retried = []

    def free_the_database(**_signal):
        retried.append(True)
        held.release()

    task_retry.connect(free_the_database, weak=False)
    try:
        result = stop_job.apply(args=(job.pk,))
    finally:
        task_retry.disconnect(free_the_database)

    assert retried == [True], "the first try met the lock and was tried again, not dropped"
    assert result.successful(), result.traceback
    job.refresh_from_db()
    assert [line.text for line in job.log_lines.all()] == ["Stopping: ending the containers on every node"]
    assert job.cleanup_report["workers"] == []


def test_a_page_that_only_reads_answers_while_the_database_is_locked(client, owner, make_job, lock):
    job = make_job(owner=owner, status=JobStatus.RUNNING)
    client.force_login(owner)
    lock()
    assert client.get(f"/jobs/{job.pk}").status_code == 200
    assert api_client(owner).get(f"/api/v1/training-jobs/{job.pk}").status_code == 200
