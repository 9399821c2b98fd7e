"""The watchdog and the ranks that ended: a rank whose agent recorded its end (as 0 or not) prints no more, and is
never listed as silent, however long ago it printed its last line. The real run is in tests/integration."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import JobEvent, JobStatus, LauncherDefaults, TrainingJob
from jobs.runtime.monitor import RunMonitor

pytestmark = pytest.mark.django_db


async def no_stop(reason: str, message: str) -> None:
    raise AssertionError("this watchdog may not stop the job")


@pytest.fixture
def running_job(make_job):
    LauncherDefaults.objects.filter(pk=LauncherDefaults.current().pk).update(watchdog_seconds=60)
    return make_job(status=JobStatus.RUNNING, started_at=timezone.now() - timedelta(minutes=10))


def monitor_of(job: TrainingJob, silent_for: dict[int, int]) -> RunMonitor:
    """A monitor of the job's 4 ranks on 2 workers, each rank last heard that many seconds ago."""
    monitor = RunMonitor(job.pk, (0, 0, 1, 1), {0: "node-a", 1: "node-b"}, no_stop)
    now = timezone.now()
    monitor.last_heard = {rank: now - timedelta(seconds=seconds) for rank, seconds in silent_for.items()}
    return monitor


def test_a_rank_that_printed_its_last_line_and_exited_is_not_listed_as_hung(running_job):
    monitor = monitor_of(running_job, {0: 1, 1: 300, 2: 300, 3: 1})
    monitor.take_ended([1])

    monitor.tick()

    running_job.refresh_from_db()
    assert [entry["rank"] for entry in running_job.silent_ranks] == [2], "rank 1 ended; rank 2 still runs, silent"
    assert running_job.suspected_hung_since is not None


def test_a_job_whose_only_silent_ranks_ended_is_not_suspected_hung_at_all(running_job):
    monitor = monitor_of(running_job, {0: 1, 1: 300, 2: 300, 3: 1})
    monitor.take_ended([1, 2])

    monitor.tick()

    running_job.refresh_from_db()
    assert (running_job.suspected_hung_since, running_job.silent_ranks) == (None, [])
    assert not JobEvent.objects.filter(job=running_job, kind="watchdog").exists()


def test_a_job_suspected_hung_for_ranks_that_then_end_is_cleared_and_the_timeline_says_they_ended(running_job):
    monitor = monitor_of(running_job, {0: 1, 1: 300, 2: 300, 3: 1})
    monitor.tick()
    monitor.take_ended([1, 2])

    monitor.tick()

    running_job.refresh_from_db()
    assert (running_job.suspected_hung_since, running_job.silent_ranks) == (None, [])
    said = list(JobEvent.objects.filter(job=running_job, kind="watchdog").order_by("id").values_list("message", flat=True))
    assert said == ["Suspected hung: rank(s) 1, 2 printed nothing for more than 60 s",
                    "No longer suspected hung: rank(s) 1, 2 ended"]
