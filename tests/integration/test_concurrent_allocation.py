"""Allocation under concurrency, on PostgreSQL: racing allocators, and fifty jobs submitted at once to a
4-node cluster served by two Celery worker processes.

Every change of a node's holder is recorded by a trigger in the database itself, in the order the
database applied it, so the tests see each allocation and release exactly as it happened: a node
must only ever go from free to one job and back to free.
"""

import threading
import time
from collections import defaultdict

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, connections
from rest_framework.test import APIClient

from console import services
from jobs.allocation import try_allocate
from jobs.models import (
    FINAL_STATES,
    CodeDirectory,
    Engine,
    EngineVersion,
    JobStatus,
    LauncherDefaults,
    Network,
    Node,
    ResourceSpec,
    TrainingJob,
)
from tests.conftest import TEST_NODE_WORK_ROOT, _worker_database_env
from tests.integration.helpers import TEST_OUTPUT, code_dir_from_program, log_text
from tests.integration.own_cluster import RUN_ID, own_cluster

pytestmark = pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="needs PostgreSQL (set DATABASE_URL=postgres://...): SQLite has one writer at a time, so it cannot show "
           "concurrent allocators racing; CI runs this on PostgreSQL",
)

JOBS = 50
NODES = 4
# Sizes cycle so that small and whole-cluster jobs contend for the same nodes.
NODE_COUNTS = [1, 2, 1, 4, 1, 2]
WORKER_PROCESSES = 2
RACERS = 40

RECORD_HOLDS = """
CREATE TABLE test_node_holds (
    id bigserial PRIMARY KEY, node_id bigint NOT NULL, old_job bigint, new_job bigint,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION test_record_node_hold() RETURNS trigger AS $$
BEGIN
    IF NEW.allocated_to_id IS DISTINCT FROM OLD.allocated_to_id THEN
        INSERT INTO test_node_holds (node_id, old_job, new_job)
        VALUES (NEW.id, OLD.allocated_to_id, NEW.allocated_to_id);
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER test_record_node_hold AFTER UPDATE ON jobs_node FOR EACH ROW EXECUTE FUNCTION test_record_node_hold();
"""
FORGET_HOLDS = """
DROP TRIGGER IF EXISTS test_record_node_hold ON jobs_node;
DROP FUNCTION IF EXISTS test_record_node_hold();
DROP TABLE IF EXISTS test_node_holds;
"""


@pytest.fixture(scope="module")
def burst_cluster():
    with own_cluster("ca", 80, nodes=NODES) as own:
        yield own.nodes


@pytest.fixture(scope="module")
def two_workers(django_db_setup, redis_url, burst_cluster):
    """Two worker processes on the same broker and database, each with its own log; the first also runs
    Celery beat, as a deployment does (the periodic dispatch and node health checks)."""
    log_dir = TEST_OUTPUT / f"burst-{RUN_ID}"
    log_dir.mkdir(parents=True, exist_ok=True)
    settings.NODE_WORK_ROOT = TEST_NODE_WORK_ROOT
    env = {**_worker_database_env(), "REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url,
           "NODE_WORK_ROOT": TEST_NODE_WORK_ROOT, "NODE_HEALTH_INTERVAL_SECONDS": "5",
           "RUN_SLOTS": str(8 * WORKER_PROCESSES)}
    logs = [log_dir / f"celery-{index}.log" for index in range(WORKER_PROCESSES)]
    processes = []
    try:
        for index, log in enumerate(logs):
            log.unlink(missing_ok=True)
            processes.append(services.start_celery_worker(env, log, concurrency=8, beat=index == 0))
        deadline = time.monotonic() + 60
        while not all(log.exists() and " ready." in log.read_text(errors="replace") for log in logs):
            if time.monotonic() > deadline or any(process.poll() is not None for process in processes):
                raise RuntimeError("a Celery worker did not start:\n" + "\n".join(
                    log.read_text(errors="replace")[-2000:] for log in logs if log.exists()))
            time.sleep(0.2)
        yield logs
    finally:
        for process in processes:
            services.stop(process)


@pytest.fixture
def hold_ledger(transactional_db):
    with connection.cursor() as cursor:
        cursor.execute(FORGET_HOLDS)
        cursor.execute(RECORD_HOLDS)
    yield
    with connection.cursor() as cursor:
        cursor.execute(FORGET_HOLDS)


@pytest.fixture
def burst_console(transactional_db, burst_cluster, two_workers, hold_ledger, mpi_image):
    EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="burst-mpi4py",
                                 image=mpi_image, python="python")
    spec = ResourceSpec.objects.create(name="burst-cpu", cpu_cores=1, memory_gb=1, cpu_slots_per_node=1,
                                       network=Network.SOCKET, max_nodes=NODES)
    LauncherDefaults.current()
    for local in burst_cluster:
        node = Node(name=local.name, address=local.address, ssh_port=local.ssh_port, ssh_user=local.ssh_user,
                    host_key=local.host_public_key, spec=spec)
        node.private_key = local.private_key_path.read_text()
        node.save()
    code_dir_from_program("burst-probe", "probe.py")
    return get_user_model().objects.create_user("owner", password="owner-password")


def submit_all_at_once(owner) -> list[int]:
    """JOBS threads, each posting one job to the API, released together."""
    start = threading.Barrier(JOBS)
    ids, errors = [], []

    def post(index: int) -> None:
        client = APIClient()
        client.force_authenticate(owner)
        body = {"name": f"burst-{index}", "engine": "burst-mpi4py", "code_dir": "burst-probe", "boot_file": "probe.py",
                "spec": "burst-cpu", "node_count": NODE_COUNTS[index % len(NODE_COUNTS)]}
        try:
            start.wait(timeout=60)
            response = client.post("/api/v1/training-jobs", body, format="json")
            if response.status_code == 201:
                ids.append(response.json()["id"])
            else:
                errors.append(response.content)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post, args=(index,)) for index in range(JOBS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[:3]
    assert len(ids) == JOBS
    return ids


def wait_until_all_end(ids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while TrainingJob.objects.filter(pk__in=ids).exclude(status__in=FINAL_STATES).exists():
        if time.monotonic() > deadline:
            stuck = TrainingJob.objects.filter(pk__in=ids).exclude(status__in=FINAL_STATES)
            raise AssertionError("jobs that never ended: " + ", ".join(f"{job.name} {job.status}" for job in stuck))
        time.sleep(0.5)


def holds_by_node() -> dict[int, list[tuple[int | None, int | None, object]]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT node_id, old_job, new_job, at FROM test_node_holds ORDER BY id")
        rows = cursor.fetchall()
    by_node = defaultdict(list)
    for node_id, old_job, new_job, at in rows:
        by_node[node_id].append((old_job, new_job, at))
    return by_node


def test_allocators_racing_for_the_same_nodes_never_both_win_one(transactional_db, hold_ledger):
    """The primitive itself, without the queue's ordering to hide a race: distinct jobs, one thread each."""
    spec = ResourceSpec.objects.create(name="contested", cpu_cores=1, memory_gb=1, max_nodes=NODES)
    for index in range(NODES):
        Node.objects.create(name=f"contested-{index}", address=f"10.0.0.{index + 1}", spec=spec)
    owner = get_user_model().objects.create_user("owner", password="owner-password")
    engine = EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="v1")
    code_dir = CodeDirectory.objects.create(name="code", path="/nowhere")
    jobs = [TrainingJob.objects.create(name=f"racer-{index}", owner=owner, engine_version=engine, code_dir=code_dir,
                                       boot_file="train.py", spec=spec, node_count=1 + index % 2, bind_args="",
                                       x_args="", mca_args="", tune_prefixes="MA_")
            for index in range(RACERS)]
    start = threading.Barrier(RACERS)
    won = {}

    def race(job: TrainingJob) -> None:
        try:
            start.wait(timeout=60)
            won[job.pk] = try_allocate(job)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=race, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    winners = [job for job in jobs if won.get(job.pk)]
    assert len(won) == RACERS
    for changes in holds_by_node().values():
        assert [(old_job, new_job is not None) for old_job, new_job, _at in changes] == [(None, True)], changes
    held = [worker.node_id for job in winners for worker in TrainingJob.objects.get(pk=job.pk).workers.all()]
    assert len(held) == len(set(held)) == sum(job.node_count for job in winners)
    assert Node.objects.filter(allocated_to__isnull=True).count() == NODES - len(held)


@pytest.mark.fault("50 jobs submitted at once on 4 nodes (2 Celery workers, PostgreSQL)", "all end, 0 double bookings, every node freed")
def test_fifty_jobs_submitted_at_once_never_share_a_node_and_all_end_with_every_node_free(burst_console, two_workers):
    started = time.monotonic()
    ids = submit_all_at_once(burst_console)
    wait_until_all_end(ids, timeout=900)
    elapsed = time.monotonic() - started

    jobs = {job.pk: job for job in TrainingJob.objects.filter(pk__in=ids).prefetch_related("workers")}
    failed = [job for job in jobs.values() if job.status != JobStatus.COMPLETED]
    assert not failed, f"{failed[0].name} {failed[0].status}: {failed[0].status_message}\n{log_text(failed[0])}"

    # Every change of holder, per node, in the database's own order: free -> one job -> free -> ...
    spans: dict[int, list[tuple[int, object, object]]] = defaultdict(list)
    for node_id, changes in holds_by_node().items():
        holder = None
        for old_job, new_job, at in changes:
            assert old_job == holder, f"node {node_id}: the record says {old_job} held it, the ledger says {holder}"
            assert (old_job is None) != (new_job is None), f"node {node_id} went from job {old_job} to job {new_job}"
            if new_job is not None:
                taken_at = at
            else:
                spans[old_job].append((node_id, taken_at, at))
            holder = new_job
        assert holder is None, f"node {node_id} is still held by job {holder}"

    assert not Node.objects.filter(allocated_to__isnull=False).exists()
    for job in jobs.values():
        held = sorted(node_id for node_id, _taken, _freed in spans[job.pk])
        assert held == sorted(worker.node_id for worker in job.workers.all()), f"{job.name} ran off its nodes"
        assert len(held) == job.node_count
        # The job ran while it held its nodes.
        assert all(taken <= job.started_at <= freed for _node, taken, freed in spans[job.pk]), job.name
    # Both worker processes did part of the work.
    for log in two_workers:
        assert "jobs.tasks.run_job" in log.read_text(errors="replace"), f"{log.name} ran no job"
    print(f"\n{JOBS} jobs on {NODES} nodes by {WORKER_PROCESSES} workers in {elapsed:.0f} s")

