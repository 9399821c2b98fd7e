"""Logs for the log tests, without a cluster: lines are stored the way the launcher stores them (jobs: make_job)."""

import pytest

from console import services
from jobs.logs import progress
from jobs.logs.store import LogRecord, store_lines
from jobs.models import LogStream, TrainingJob


def rank_line(rank: int, text: str, stream=LogStream.STDOUT, slots=2) -> LogRecord:
    return LogRecord(text=text, stream=stream, rank=rank, worker_index=rank // slots)


def system_line(text: str, worker=None) -> LogRecord:
    return LogRecord(text=text, stream=LogStream.SYSTEM, worker_index=worker)


def store(job: TrainingJob, records) -> int:
    return store_lines(job.pk, list(records)).last_seq


@pytest.fixture
def quiet_redis(settings):
    """Progress messages go to a port nobody listens on: the log must not need Redis."""
    settings.REDIS_URL = f"redis://127.0.0.1:{services.free_port()}/0"
    progress._client.cache_clear()
    progress._async_clients.clear()
    yield
    progress._client.cache_clear()
    progress._async_clients.clear()
