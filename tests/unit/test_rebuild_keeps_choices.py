"""A Rebuild copies what the job's owner chose, never the defaults of the day: metric expressions and a watchdog
time left at the defaults stay empty in the copy (the page's and tc's alike), so the copy follows the defaults
of the day it is submitted."""

from datetime import timedelta

import pytest
from django.utils import timezone
from training_console_cli.documents import submission_of

from jobs.models import JobStatus, LauncherDefaults, TrainingJob
from jobs.runtime.monitor import RunMonitor
from tests.fixtures import job_body

pytestmark = pytest.mark.django_db

OWN_METRIC = {"name": "top1", "regex": r"top1=(?P<value>[0-9.]+)"}


@pytest.fixture
def submit(api, catalogue, django_capture_on_commit_callbacks):
    def post(body: dict) -> TrainingJob:
        with django_capture_on_commit_callbacks(execute=False):
            response = api.post("/api/v1/training-jobs", body, format="json")
        assert response.status_code == 201, response.content
        return TrainingJob.objects.get(pk=response.json()["id"])
    return post


def set_default_watchdog(seconds: int) -> None:
    LauncherDefaults.objects.filter(pk=LauncherDefaults.current().pk).update(watchdog_seconds=seconds)


def watchdog_input(page: str) -> str:
    start = page.index('id="id_watchdog_seconds"')
    return page[start:page.index(">", start)]


async def no_stop(reason: str, message: str) -> None:
    raise AssertionError("the watchdog here may not stop jobs")


def test_an_owner_who_left_the_defaults_gets_a_rebuild_page_with_no_watchdog_time_and_no_metric_rows(client, owner, submit):
    set_default_watchdog(600)
    job = submit(job_body())
    set_default_watchdog(900)
    client.force_login(owner)

    page = client.get(f"/jobs/{job.pk}/rebuild").content.decode()

    assert (job.watchdog_seconds, job.metric_definitions) == (None, [])
    assert 'value=""' in watchdog_input(page), "the old default is not typed in as if the owner had chosen it"
    assert 'name="metric_name" value=' not in page, "no metric row: the defaults are not written out as the owner's"
    assert "600" not in watchdog_input(page)


def test_an_owner_who_chose_a_watchdog_time_and_metrics_gets_them_back_on_the_rebuild_page(client, owner, submit):
    job = submit(job_body(watchdog_seconds=120, metrics=[OWN_METRIC]))
    client.force_login(owner)

    page = client.get(f"/jobs/{job.pk}/rebuild").content.decode()

    assert 'value="120"' in watchdog_input(page)
    assert 'value="top1"' in page


def test_a_copy_submitted_after_the_administrator_changed_the_default_watchdog_is_watched_with_the_new_one(
        client, owner, submit):
    set_default_watchdog(600)
    original = submit(job_body())
    set_default_watchdog(5)
    client.force_login(owner)
    initial = client.get(f"/jobs/{original.pk}/rebuild").context["form"].initial

    copy = submit(job_body(name="train-1-copy", watchdog_seconds=initial["watchdog_seconds"], metrics=initial["metrics"]))
    TrainingJob.objects.filter(pk=copy.pk).update(status=JobStatus.RUNNING, started_at=timezone.now())
    monitor = RunMonitor(copy.pk, (0, 0, 1, 1), {0: "node-a", 1: "node-b"}, no_stop)
    now = timezone.now()
    monitor.last_heard = {0: now - timedelta(seconds=10), 1: now}

    monitor.tick()

    assert TrainingJob.objects.get(pk=copy.pk).silent_ranks[0]["rank"] == 0, "silent 10 s against the default of 5 s"
    assert "5 s" in client.get(f"/jobs/{copy.pk}").content.decode().split("Watchdog", 1)[1][:80]


def test_tc_rebuild_of_a_job_left_at_the_defaults_sends_neither_the_default_metrics_nor_the_default_watchdog(api, submit):
    original = submit(job_body())
    set_default_watchdog(45)
    detail = api.get(f"/api/v1/training-jobs/{original.pk}").json()

    body = submission_of(detail, None)
    copy = submit({**body, "name": "train-1-copy"})

    assert (body["watchdog_seconds"], body["metrics"]) == (None, [])
    assert (copy.watchdog_seconds, copy.metric_definitions) == (None, [])


def test_tc_rebuild_of_a_job_with_its_own_watchdog_and_metrics_carries_them(api, submit):
    original = submit(job_body(watchdog_seconds=0, metrics=[OWN_METRIC]))
    detail = api.get(f"/api/v1/training-jobs/{original.pk}").json()

    copy = submit({**submission_of(detail, None), "name": "train-1-copy"})

    assert (copy.watchdog_seconds, copy.metric_definitions) == (0, [OWN_METRIC])
