"""Jobs and logs for the log tests, without a cluster: lines are stored the way the launcher stores them."""

import pytest
from django.contrib.auth import get_user_model

from console import services
from jobs.logs import progress
from jobs.logs.store import LogRecord, store_lines
from jobs.models import CodeDirectory, Engine, EngineVersion, LogStream, ResourceSpec, TrainingJob


def make_job(owner=None, *, name="job", node_count=2, network="socket", **fields) -> TrainingJob:
    owner = owner or get_user_model().objects.create_user(f"owner-of-{name}")
    spec, _ = ResourceSpec.objects.get_or_create(
        name=f"cpu-{network}", defaults={"cpu_cores": 2, "memory_gb": 4, "cpu_slots_per_node": 2, "network": network})
    engine, _ = EngineVersion.objects.get_or_create(engine=Engine.objects.get_or_create(name="MPI")[0], version="v1")
    code_dir, _ = CodeDirectory.objects.get_or_create(name="code", defaults={"path": "/nonexistent"})
    return TrainingJob.objects.create(
        name=name, owner=owner, engine_version=engine, code_dir=code_dir, boot_file="train.py", spec=spec,
        node_count=node_count, bind_args="", x_args="", mca_args="", tune_prefixes="MA_", **fields,
    )


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
