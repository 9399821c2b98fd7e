"""The run's monitor takes the lines its log sink stored as they are stored (one pass, nothing read back),
reads back from the database only what it was not told of, and looks at the job before any line."""

import pytest
from django.utils import timezone

from jobs.logs import store as log_store
from jobs.logs.store import store_lines
from jobs.models import JobStatus, MetricPoint, TrainingJob
from jobs.runtime import monitor as monitor_module
from jobs.runtime.monitor import RunMonitor
from tests.unit.log_helpers import quiet_redis, rank_line, system_line  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet_redis")]


async def no_stop(reason: str, message: str) -> None:
    raise AssertionError("nothing here asks for a stop")


@pytest.fixture
def running(make_job):
    job = make_job(name="fed", status=JobStatus.RUNNING)
    TrainingJob.objects.filter(pk=job.pk).update(started_at=timezone.now())
    return job


@pytest.fixture
def read_backs(monkeypatch):
    """Each read of stored lines back from the database, by where it started."""
    seen: list[int] = []
    real = monitor_module.lines_after

    def counted(job_id, after, limit):
        seen.append(after)
        return real(job_id, after, limit)

    monkeypatch.setattr(monitor_module, "lines_after", counted)
    return seen


def test_lines_the_sink_stored_are_taken_as_told_and_never_read_back(running, read_backs):
    monitor = RunMonitor(running.pk, (0, 0), {0: "node-a"}, no_stop)
    for step in range(3):
        result = store_lines(running.pk, [rank_line(rank, f"step {step} loss={1.0 / (step + 1)}") for rank in (0, 1)])
        monitor.take_stored(result.lines)  # as LogSink.on_stored calls it

    monitor.tick()

    assert read_backs == []
    assert MetricPoint.objects.filter(job=running, name="loss").count() == 6
    assert monitor.cursor == 6


def test_lines_stored_beside_the_sink_are_read_back_and_only_those(running, read_backs):
    monitor = RunMonitor(running.pk, (0,), {0: "node-a"}, no_stop)
    first = store_lines(running.pk, [rank_line(0, "step 0 loss=1.0")])
    monitor.take_stored(first.lines)
    log_store.service_line(running.pk, "a line of the platform's, stored by another writer")
    log_store.service_line(running.pk, "and another")
    second = store_lines(running.pk, [rank_line(0, "step 1 loss=0.5")])
    monitor.take_stored(second.lines)

    monitor.tick()

    assert read_backs == [first.last_seq], "the gap of two lines, read back once"
    assert list(MetricPoint.objects.filter(job=running).order_by("seq").values_list("value", flat=True)) == [1.0, 0.5]
    assert monitor.cursor == second.last_seq


def test_a_stop_is_seen_before_any_line_is_read(running, read_backs):
    monitor = RunMonitor(running.pk, (0,), {0: "node-a"}, no_stop)
    store_lines(running.pk, [rank_line(0, f"line {number}") for number in range(2000)] + [system_line("end")])
    TrainingJob.objects.filter(pk=running.pk).update(status=JobStatus.TERMINATING)

    assert monitor.tick() is None

    assert monitor.status == JobStatus.TERMINATING and read_backs == [], "the flood waits for the end; the stop does not"
