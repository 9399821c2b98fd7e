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


def badge_of(page: str) -> str:
    start = page.index("data-state-badge")
    return page[page.rindex("<span", 0, start):page.index("</span>", start) + len("</span>")]


def suspect(job: TrainingJob, minutes_silent: int) -> None:
    since = timezone.now() - timedelta(minutes=minutes_silent)
    TrainingJob.objects.filter(pk=job.pk).update(
        suspected_hung_since=since + timedelta(minutes=1),
        silent_ranks=[{"rank": 2, "worker": 1, "node": "node-b", "silent_since": since.isoformat(), "last_line": "step 40"},
                      {"rank": 3, "worker": 1, "node": "node-b", "silent_since": timezone.now().isoformat(),
                       "last_line": "step 41"}])


def test_the_list_shows_a_job_suspected_hung_as_running_and_silent_for_so_long_naming_its_ranks_on_hover(
        client, owner, running_job):
    suspect(running_job, minutes_silent=12)
    client.force_login(owner)

    badge = badge_of(client.get("/").content.decode())

    assert "Running · silent 12 min</span>" in badge, "counted from the rank silent longest"
    assert 'title="Suspected hung: rank(s) 2, 3 printed nothing for more than 60 s"' in badge
    assert "data-hung" in badge and 'data-status="Running"' in badge, "the page's scripts still read the state"


def test_the_job_pages_live_header_says_so_too_in_hours_once_silent_for_hours(client, owner, running_job):
    suspect(running_job, minutes_silent=185)
    client.force_login(owner)

    badge = badge_of(client.get(f"/jobs/{running_job.pk}/live").content.decode())

    assert "Running · silent 3 h</span>" in badge


def test_a_running_job_nobody_suspects_and_an_ended_job_that_was_suspected_show_their_state_alone(
        client, owner, running_job, make_job):
    ended = make_job(name="ended", status=JobStatus.FAILED)
    suspect(ended, minutes_silent=30)
    client.force_login(owner)

    for job in (running_job, ended):
        badge = badge_of(client.get(f"/jobs/{job.pk}").content.decode())
        assert "silent" not in badge and "data-hung" not in badge and "title=" not in badge, badge
