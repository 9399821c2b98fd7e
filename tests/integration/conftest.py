"""Real services for the integration tests: a Redis, a Celery worker and a local cluster of SSH nodes.

The worker is a separate process that opens the same test database, so these tests use
`transactional_db`: what a test writes is committed and the worker sees it.
"""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from console import services
from console.celery import app as celery_app
from jobs import localcluster, progress
from jobs.models import Engine, EngineVersion, LauncherDefaults, Network, Node, ResourceSpec
from tests.integration.helpers import CLUSTER_NODES, CLUSTER_SLOTS, TEST_OUTPUT

# TEST_RUN_ID (0-99) keeps test runs that share this machine apart: their own bridge, subnet and
# node work directories, apart from any console running here, so each cleans up only its own.
RUN_ID = int(os.environ.get("TEST_RUN_ID", "0"))
TEST_NODE_WORK_ROOT = f"/var/lib/training-console/test-jobs-{RUN_ID}"
CLUSTER_OPTIONS = {"subnet": f"10.79.{RUN_ID}.0/24", "bridge": f"tcit{RUN_ID}br", "prefix": f"tcit{RUN_ID}n"}


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    port = services.free_port()
    log_dir = tmp_path_factory.mktemp("redis")
    process = services.start_redis(port, log_dir / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    settings.REDIS_URL = settings.CELERY_BROKER_URL = url
    celery_app.conf.broker_url = url
    progress._client.cache_clear()
    yield url
    services.stop(process)


@pytest.fixture(scope="session")
def local_cluster():
    state_dir = Path(settings.VAR_DIR) / "test-localcluster"
    localcluster.down(state_dir, bridge=CLUSTER_OPTIONS["bridge"], prefix=CLUSTER_OPTIONS["prefix"])
    nodes = localcluster.up(state_dir, CLUSTER_NODES, **CLUSTER_OPTIONS)
    yield nodes
    localcluster.down(state_dir, bridge=CLUSTER_OPTIONS["bridge"], prefix=CLUSTER_OPTIONS["prefix"])


def _worker_database_env() -> dict[str, str]:
    database = connection.settings_dict
    if database["ENGINE"].endswith("sqlite3"):
        return {"CONSOLE_SQLITE_PATH": str(database["NAME"])}
    user = database.get("USER") or ""
    password = f":{database['PASSWORD']}" if database.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    host = database.get("HOST") or "localhost"
    port = f":{database['PORT']}" if database.get("PORT") else ""
    return {"DATABASE_URL": f"postgres://{auth}{host}{port}/{database['NAME']}"}


@pytest.fixture(scope="session")
def celery_worker(django_db_setup, django_db_blocker, redis_url, local_cluster):
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    log_path = TEST_OUTPUT / f"celery-worker-{RUN_ID}.log"
    settings.NODE_WORK_ROOT = TEST_NODE_WORK_ROOT
    env = {**_worker_database_env(), "REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url,
           "NODE_WORK_ROOT": TEST_NODE_WORK_ROOT}
    process = services.start_celery_worker(env, log_path)
    deadline = time.monotonic() + 60
    while True:
        replies = celery_app.control.ping(timeout=1.0)
        if replies:
            break
        if process.poll() is not None or time.monotonic() > deadline:
            services.stop(process)
            raise RuntimeError(f"the Celery worker did not start; see {log_path}:\n{log_path.read_text()[-3000:]}")
    yield process
    services.stop(process)


@pytest.fixture
def console(transactional_db, celery_worker, local_cluster):
    """A console with an MPI engine and the local cluster's nodes registered, as `make run` leaves it."""
    mpi = Engine.objects.create(name="MPI")
    engine = EngineVersion.objects.create(engine=mpi, version="local-mpi4py", python="/usr/bin/python3")
    spec = ResourceSpec.objects.create(
        name="local-cpu", cpu_cores=CLUSTER_SLOTS, memory_gb=4, cpu_slots_per_node=CLUSTER_SLOTS, network=Network.SOCKET
    )
    LauncherDefaults.current()
    nodes = []
    for local in local_cluster:
        node = Node(name=local.name, address=local.address, ssh_port=local.ssh_port, ssh_user=local.ssh_user,
                    host_key=local.host_public_key, spec=spec)
        node.private_key = local.private_key_path.read_text()
        node.save()
        nodes.append(node)
    return {"engine": engine, "spec": spec, "nodes": nodes, "cluster": local_cluster}


@pytest.fixture
def programs_dir():
    return Path(__file__).resolve().parent / "programs"


def pytest_sessionfinish(session, exitstatus):
    # Leave no job container behind even when a test failed halfway.
    root = Path(TEST_NODE_WORK_ROOT)
    if root.is_dir() and os.geteuid() == 0:
        for stop_script in root.glob("*/worker-*/stop-container.sh"):
            subprocess.run(["sh", str(stop_script), str(stop_script.parent)], capture_output=True, timeout=30)
        shutil.rmtree(root, ignore_errors=True)
