"""A run's heartbeat: it keeps beating while other runs in the same worker process are slow, and through
database errors. Either failure would let the reaper end a healthy job as lost."""

import asyncio
import logging
import threading
import time
from types import SimpleNamespace

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError

from jobs.runtime import run
from jobs.runtime.run import JobRun, in_own_context

BEAT = 0.05


def beats_for(seconds: float, job_id: int = 1) -> None:
    """One run's heartbeat, for a while, in its own event loop (as a Celery thread runs a job)."""

    async def beating() -> None:
        task = asyncio.create_task(JobRun(SimpleNamespace(job_id=job_id)).beat())
        await asyncio.sleep(seconds)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(in_own_context(beating()))


def slow_database_work(seconds: float, times: int) -> None:
    """Another run whose database steps are slow (a long query, a locked table)."""

    async def working() -> None:
        for _ in range(times):
            await sync_to_async(time.sleep)(seconds)

    asyncio.run(in_own_context(working()))


@pytest.fixture
def beat_times(monkeypatch):
    """When the heartbeat reached the database; the touch itself is kept out, only its timing matters here."""
    times: list[float] = []
    monkeypatch.setattr(run, "HEARTBEAT_SECONDS", BEAT)
    monkeypatch.setattr(run, "_touch_heartbeat", lambda job_id, owner="": times.append(time.monotonic()) or True)
    return times


def test_one_runs_slow_database_work_does_not_delay_another_runs_heartbeat(beat_times):
    slow = threading.Thread(target=slow_database_work, args=(0.6, 3))
    slow.start()
    time.sleep(0.05)  # the slow run holds its database thread first
    beats_for(1.2)
    slow.join()
    gaps = [later - earlier for earlier, later in zip(beat_times, beat_times[1:], strict=False)]
    assert len(beat_times) >= 10, f"only {len(beat_times)} beats in 1.2 s"
    # Sharing one database thread, each beat would wait out the other run's 0.6 s steps.
    assert max(gaps) < 0.4, f"the heartbeat waited {max(gaps):.2f} s behind the other run"


def test_the_heartbeat_goes_on_after_database_errors_and_says_so(monkeypatch, caplog):
    calls: list[float] = []

    def flaky_touch(job_id: int, owner: str = "") -> bool:
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise OperationalError("database is locked")
        return True

    monkeypatch.setattr(run, "HEARTBEAT_SECONDS", BEAT)
    monkeypatch.setattr(run, "_touch_heartbeat", flaky_touch)
    with caplog.at_level(logging.WARNING, logger="jobs.runtime.run"):
        beats_for(0.6, job_id=7)
    assert len(calls) >= 6, "the heartbeat stopped at the first error"
    warnings = [record.getMessage() for record in caplog.records if "heartbeat failed" in record.getMessage()]
    assert len(warnings) == 2 and "job 7" in warnings[0] and "database is locked" in warnings[0]


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_touches_the_jobs_row(make_job, monkeypatch):
    job = make_job()
    monkeypatch.setattr(run, "HEARTBEAT_SECONDS", BEAT)
    beats_for(0.2, job_id=job.pk)
    job.refresh_from_db()
    assert job.heartbeat_at is not None
