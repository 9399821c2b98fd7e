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
# Only a bound on a run gone wrong: the tests wait for events (beats counted), never for an amount of time.
DEADLINE_SECONDS = 30.0


def beats_until(done, job_id: int = 1) -> None:
    """One run's heartbeat, in its own event loop (as a Celery thread runs a job), until `done()` says so."""

    async def beating() -> None:
        task = asyncio.create_task(JobRun(SimpleNamespace(job_id=job_id)).beat())
        deadline = time.monotonic() + DEADLINE_SECONDS
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(in_own_context(beating()))


def database_work_held_until(released: threading.Event, started: threading.Event) -> None:
    """Another run whose database step does not end until it is released (a long query, a locked table)."""

    def held() -> None:
        started.set()
        released.wait(DEADLINE_SECONDS)

    async def working() -> None:
        await sync_to_async(held)()

    asyncio.run(in_own_context(working()))


@pytest.fixture
def beat_times(monkeypatch):
    """When the heartbeat reached the database; the touch itself is kept out, only that it happens matters here."""
    times: list[float] = []
    monkeypatch.setattr(run, "HEARTBEAT_SECONDS", BEAT)
    monkeypatch.setattr(run, "_touch_heartbeat", lambda job_id, owner="": times.append(time.monotonic()) or True)
    return times


def test_one_runs_held_database_work_does_not_hold_another_runs_heartbeat(beat_times):
    released, started = threading.Event(), threading.Event()
    other_run = threading.Thread(target=database_work_held_until, args=(released, started))
    other_run.start()
    try:
        assert started.wait(DEADLINE_SECONDS), "the other run's database step began"
        # Sharing one database thread, not one beat would get through while the other run's step is held.
        beats_until(lambda: len(beat_times) >= 5)
        beats_while_held = len(beat_times)
    finally:
        released.set()
        other_run.join()
    assert beats_while_held >= 5, f"{beats_while_held} beat(s) while another run's database step was held"


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
        beats_until(lambda: len(calls) >= 6, job_id=7)
    assert len(calls) >= 6, "the heartbeat stopped at the first error"
    warnings = [record.getMessage() for record in caplog.records if "heartbeat failed" in record.getMessage()]
    assert len(warnings) == 2 and "job 7" in warnings[0] and "database is locked" in warnings[0]


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_touches_the_jobs_row(make_job, monkeypatch):
    job = make_job()
    monkeypatch.setattr(run, "HEARTBEAT_SECONDS", BEAT)
    touched: list[float] = []
    touch = run._touch_heartbeat
    def touch_and_tell(job_id: int, owner: str = "") -> bool:
        done = touch(job_id, owner)
        touched.append(1)
        return done

    monkeypatch.setattr(run, "_touch_heartbeat", touch_and_tell)
    beats_until(lambda: len(touched) >= 1, job_id=job.pk)
    job.refresh_from_db()
    assert job.heartbeat_at is not None
