"""Real services for the integration and browser tests: a Redis, a Celery worker and a local cluster of SSH nodes.

The worker is a separate process that opens the same test database, so these tests use
`transactional_db`: what a test writes is committed and the worker sees it. The fixtures live here,
above both folders, so a run of both starts each service once.
"""

import os
import secrets
import shlex
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import botocore.exceptions
import pytest
from django.conf import settings
from django.db import connection

from console import services
from console.celery import app as celery_app
from jobs import localcluster, localstore
from jobs.images import registry
from jobs.images.build import build
from jobs.images.recipes import HOROVOD, MINDSPORE, MPI
from jobs.launch.network_policy import policy_tables, removal
from jobs.logs import progress
from jobs.models import Engine, EngineVersion, LauncherDefaults, Network, Node, ResourceSpec
from jobs.object_store.client import ObjectStore, StoreAccess
from tests.integration.helpers import CLUSTER_NODES, CLUSTER_SLOTS, PROGRAMS, TEST_OUTPUT, on_node
from tests.suite_tables import collect_rows, record_result, write_tables

# TEST_RUN_ID (0-99) keeps test runs that share this machine apart: their own bridge, subnet and
# node work directories, apart from any console running here, so each cleans up only its own.
RUN_ID = int(os.environ.get("TEST_RUN_ID", "0"))
TEST_NODE_WORK_ROOT = f"/var/lib/training-console/test-jobs-{RUN_ID}"
# The Celery workers this session started (see pytest_sessionfinish).
STARTED_WORKERS: list["CeleryWorker"] = []
CLUSTER_OPTIONS = {"subnet": f"10.79.{RUN_ID}.0/24", "bridge": f"tcit{RUN_ID}br", "prefix": f"tcit{RUN_ID}n"}


class RedisServer:
    """The tests' Redis; restart() ends it and starts an empty one on the same port, as a crash and restart would."""

    def __init__(self, port: int, log_path: Path):
        self.port, self.log_path = port, log_path
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process = None

    def start(self) -> None:
        self.process = services.start_redis(self.port, self.log_path)

    def stop(self) -> None:
        services.stop(self.process)

    def restart(self) -> None:
        self.stop()
        self.start()
        progress._client.cache_clear()  # its connection was to the server that is gone


def pytest_configure(config):
    """Passwords are hashed with MD5 in the tests: the real hasher's work is made slow on purpose (about
    0.3 s a user), and the tests only need a password to be checked, not to be hard to guess. pytest-django
    has set Django up by now; the caches are cleared as the settings_changed signal would."""
    from django.contrib.auth.hashers import get_hashers, get_hashers_by_algorithm

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    get_hashers.cache_clear()
    get_hashers_by_algorithm.cache_clear()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(services.free_port(), tmp_path_factory.mktemp("redis") / "redis.log")
    server.start()
    settings.REDIS_URL = settings.CELERY_BROKER_URL = server.url
    celery_app.conf.broker_url = server.url
    # A connection pool made earlier in the session (a unit test that queued a task) still points at the
    # old broker; dropped, the next task or ping makes one to this Redis (as Celery does after a fork).
    celery_app._pool = None
    celery_app.amqp._producer_pool = None
    progress._client.cache_clear()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server):
    return redis_server.url


LOCAL_CLUSTER_DIR = Path(f"/var/lib/training-console/test-localcluster-{RUN_ID}")


@pytest.fixture(scope="session")
def local_cluster():
    localcluster.down(LOCAL_CLUSTER_DIR, bridge=CLUSTER_OPTIONS["bridge"], prefix=CLUSTER_OPTIONS["prefix"])
    nodes = localcluster.up(LOCAL_CLUSTER_DIR, CLUSTER_NODES, **CLUSTER_OPTIONS)
    yield nodes
    localcluster.down(LOCAL_CLUSTER_DIR, bridge=CLUSTER_OPTIONS["bridge"], prefix=CLUSTER_OPTIONS["prefix"])


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


def web_server_env(redis_url: str) -> dict[str, str]:
    """What the console's web server needs when a test starts it (console.services.start_web_server): the
    test database, and the tests' Redis as its broker and live-progress stream."""
    return {**_worker_database_env(), "REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url}


class CeleryWorker:
    """The tests' Celery worker process. Celery 5.7 with the Redis transport ends the worker (after its
    running tasks) when Redis goes away under a task it has not acknowledged yet, so a test that restarts
    Redis restarts the worker afterwards."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.env, self.log_path = env, log_path
        self.process = None

    def start(self) -> None:
        self.process = services.start_celery_worker(self.env, self.log_path)
        deadline = time.monotonic() + 60
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                services.stop(self.process)
                raise RuntimeError(f"the Celery worker did not start; see {self.log_path}:\n"
                                   f"{self.log_path.read_text()[-3000:]}")

    @staticmethod
    def answers() -> bool:
        # A connection of its own: pooled ones may still point at a Redis that was restarted.
        with celery_app.connection_for_write() as connection:
            return bool(celery_app.control.ping(timeout=1.0, connection=connection))

    def stop(self) -> None:
        services.stop(self.process)

    def restart(self) -> None:
        self.stop()
        self.start()


# The tests' read-only image registry (as `make run` starts one), over the images' registry folder.
IMAGE_REGISTRY_PORT = 15077 + RUN_ID


@pytest.fixture(scope="session")
def image_registry():
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    settings.IMAGE_REGISTRY_PORT = IMAGE_REGISTRY_PORT
    text = registry.config(registry.storage_dir(), IMAGE_REGISTRY_PORT, read_only=True)
    server = registry.start(TEST_OUTPUT / f"image-registry-{RUN_ID}.yml", IMAGE_REGISTRY_PORT, text,
                            TEST_OUTPUT / f"image-registry-{RUN_ID}.log")
    yield IMAGE_REGISTRY_PORT
    services.stop(server)


@pytest.fixture(scope="session")
def celery_worker(django_db_setup, django_db_blocker, redis_url, local_cluster, image_registry):
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    settings.NODE_WORK_ROOT = TEST_NODE_WORK_ROOT
    env = {**_worker_database_env(), "REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url,
           "NODE_WORK_ROOT": TEST_NODE_WORK_ROOT,
           # Short jobs still get a few resource samples per worker.
           "WORKER_PROBE_SECONDS": "2", "RESOURCE_SAMPLE_SECONDS": "2",
           # A job's object-store output is uploaded every 2 s, so a stop's test sees uploads under way.
           "OUTPUT_SYNC_SECONDS": "2",
           # And a file of the output larger than 5 MiB (the smallest part a store takes) goes in parts.
           "OUTPUT_PART_BYTES": str(5 * 1024 * 1024),
           # A rank that ended on its own while the others wait: the job is failed 10 s later.
           "RANK_EXIT_GRACE_SECONDS": "10",
           # A failed job's hold for debugging counts seconds, not minutes (the maximum a job may ask is unchanged).
           "DEBUG_HOLD_MINUTE_SECONDS": "1",
           # The tests load the images they use themselves; a prefetch would copy the others under every test.
           "IMAGE_PREFETCH": "0", "IMAGE_REGISTRY_PORT": str(image_registry)}
    worker = CeleryWorker(env, TEST_OUTPUT / f"celery-worker-{RUN_ID}.log")
    worker.start()
    STARTED_WORKERS.append(worker)
    yield worker
    worker.stop()


# The tests' own SeaweedFS: its S3 gateway here, its master, volume and filer on the next three ports.
OBJECT_STORE_PORT = 19000 + 10 * RUN_ID
# A second identity of the tests' store, whose keys a team would hand its members: they list and read one bucket
# no console user owns (tests/integration/test_object_storage.py sets them as a user's own keys).
TEAM_BUCKET = "team-datasets"
TEAM_READER = localstore.Identity(
    "team-reader", localstore.StoreKeys("TEAM" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30)),
    (f"Read:{TEAM_BUCKET}", f"List:{TEAM_BUCKET}"))


class ObjectStoreServer:
    """The tests' SeaweedFS, which a fault test may stop and start again (its data stays)."""

    def __init__(self, state: Path, address: str, port: int, others: tuple[localstore.Identity, ...] = ()):
        self.state, self.address, self.port, self.others = state, address, port, others
        self.endpoint = localstore.endpoint(address, port)
        self.process = None

    def start(self) -> None:
        keys = localstore.keys(self.state, self.others)
        self.process = services.start_object_store(localstore.server_argv(self.state, self.address, self.port),
                                                   self.address, self.port, TEST_OUTPUT / f"objectstore-{RUN_ID}.log")
        # Started again, it takes a few more seconds before the buckets it holds take writes (their volumes
        # register with its master one by one): a test after a restart starts once one does.
        store = ObjectStore(StoreAccess(self.endpoint, keys.access_key, keys.secret_key))
        store.create_bucket("ready-probe")
        deadline = time.monotonic() + 60
        while True:
            try:
                for bucket in [str(item["Name"]) for item in store.client.list_buckets().get("Buckets", [])]:
                    store.client.put_object(Bucket=bucket, Key="ready-probe", Body=b"1")
                    store.client.delete_object(Bucket=bucket, Key="ready-probe")
                return
            except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        services.stop(self.process, timeout=30)

    def kill(self) -> None:
        """Gone at once, as a crashed store or a cut network is (its SIGTERM takes ten seconds or more)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="session")
def object_store(local_cluster, tmp_path_factory):
    """A real object store (SeaweedFS, as `make run` starts it) where the test cluster's nodes reach it."""
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    server = ObjectStoreServer(tmp_path_factory.mktemp("objectstore"), localcluster.gateway(CLUSTER_OPTIONS["subnet"]),
                               OBJECT_STORE_PORT, others=(TEAM_READER,))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mpi_image():
    """The shipped MPI engine image, built once per machine (its archive is cached by the recipe's hash)."""
    build(MPI, say=lambda text: print(text, flush=True))
    return MPI.reference


@pytest.fixture(scope="session")
def horovod_image():
    """The Horovod engine image (PyTorch CPU), built once per machine like the MPI one (about 10 min from scratch)."""
    build(HOROVOD, say=lambda text: print(text, flush=True))
    return HOROVOD.reference


@pytest.fixture(scope="session")
def mindspore_image():
    """The MindSpore engine image (CPU), built once per machine like the MPI one."""
    build(MINDSPORE, say=lambda text: print(text, flush=True))
    return MINDSPORE.reference


def without_earlier_policies(local_cluster, test: str) -> None:
    """Remove the network policies an earlier test's job left on the nodes. Each test starts from an empty
    database, so a job of the test before that was still ending (or whose node the console kept out of service
    until its next check) holds nodes this test's jobs are given: its policy, for the same job uid, would refuse
    their traffic. What was found goes to the run's output, so that a job that leaves one is seen. In a thread of
    its own: the browser tests' Playwright keeps an event loop running in the test's thread."""
    def remove(local) -> None:
        left = policy_tables(on_node(local, "nft list tables inet"))
        if left:
            with open(TEST_OUTPUT / f"leftover-policies-{RUN_ID}.log", "a") as log:
                log.write(f"{test}: {local.name} held {' '.join(left)}\n")
            on_node(local, f"printf '%s' {shlex.quote(removal(left))} | nft -f -")

    with ThreadPoolExecutor(max_workers=1) as thread:
        for local in local_cluster:
            thread.submit(remove, local).result()


@pytest.fixture
def console(request, transactional_db, celery_worker, local_cluster, mpi_image):
    """A console with an MPI engine and the local cluster's nodes registered, as `make run` leaves it."""
    without_earlier_policies(local_cluster, request.node.nodeid)
    mpi = Engine.objects.create(name="MPI")
    engine = EngineVersion.objects.create(engine=mpi, version="local-mpi4py", image=mpi_image, python=MPI.python)
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
    return PROGRAMS


def pytest_collection_finish(session):
    collect_rows(session.items)


def pytest_runtest_logreport(report):
    record_result(report)


def pytest_terminal_summary(terminalreporter):
    write_tables(terminalreporter)


def pytest_sessionfinish(session, exitstatus):
    # Leave no job container behind even when a test failed halfway; only a session that started the
    # cluster's worker cleans up, so a unit-test run beside an integration run never ends its containers.
    # (The local cluster's `down` ends every container of its nodes.)
    root = Path(TEST_NODE_WORK_ROOT)
    if STARTED_WORKERS and root.is_dir() and os.geteuid() == 0:
        shutil.rmtree(root, ignore_errors=True)
