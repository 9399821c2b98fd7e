"""`tc rebuild` and `tc compare` against the console's real web server (under uvicorn, on the test database;
no worker or cluster needed: the jobs are made in the database, and a rebuild is only submitted)."""

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from console import services
from jobs.models import ApiToken, CodeDirectory, EngineVersion, JobStatus, MetricPoint, ResourceSpec, TrainingJob
from tests.conftest import RUN_ID, web_server_env
from tests.fixtures import catalogue, new_job, owner  # noqa: F401 - fixtures, found by name
from tests.integration.helpers import TEST_OUTPUT

TC = Path(sys.executable).parent / "tc"


@pytest.fixture
def tc(transactional_db, redis_url, owner, tmp_path):  # noqa: F811 - owner is the fixture imported above
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    port = services.free_port()
    process = services.start_web_server(port, web_server_env(redis_url), TEST_OUTPUT / f"uvicorn-compare-{RUN_ID}.log")
    env = {**os.environ, "TC_URL": f"http://127.0.0.1:{port}", "TC_TOKEN": ApiToken.issue(owner, "cli")[1],
           "TC_CONFIG": str(tmp_path / "tc.json")}
    try:
        yield lambda *argv: subprocess.run([str(TC), *argv], capture_output=True, text=True, env=env, timeout=60)
    finally:
        services.stop(process)


def finished(owner, name: str, lr: str, loss: float) -> TrainingJob:  # noqa: F811
    started = timezone.now() - timedelta(minutes=3)
    job = new_job(owner=owner, name=name, status=JobStatus.COMPLETED, started_at=started, ended_at=timezone.now(),
                  parameters=[{"name": "lr", "value": lr}], final_metrics={"loss": loss})
    MetricPoint.objects.create(job=job, name="loss", rank=0, step=1, value=loss, at=timezone.now(), seq=1)
    return job


def test_tc_compare_prints_what_differs_and_the_finals_and_its_json_is_the_apis(tc, owner):  # noqa: F811
    first, second = finished(owner, "small", "0.01", 0.5), finished(owner, "large", "0.1", 0.25)

    table = tc("compare", str(first.pk), "large")
    answer = tc("compare", str(first.pk), str(second.pk), "--json")
    alone = tc("compare", str(first.pk))

    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert any(line.split()[:4] == ["parameters:", "lr", "0.01", "0.1"] for line in lines), table.stdout
    assert any(line.split()[:3] == ["loss", "0.5", "0.25"] for line in lines), table.stdout
    assert [line["job"] for line in json.loads(answer.stdout)["series"]] == [first.pk, second.pk]
    assert alone.returncode != 0 and "1 given" in alone.stderr


def test_tc_rebuild_records_the_job_it_was_made_from(tc, owner, catalogue):  # noqa: F811
    source = new_job(owner=owner, name="source", status=JobStatus.COMPLETED,
                     engine_version=EngineVersion.objects.get(version="local"),
                     code_dir=CodeDirectory.objects.get(name="gpu-train"), spec=ResourceSpec.objects.get(name="cpu"))

    done = tc("rebuild", str(source.pk), "--name", "rebuilt")

    assert done.returncode == 0, done.stderr
    assert TrainingJob.objects.get(name="rebuilt").rebuilt_from_id == source.pk
