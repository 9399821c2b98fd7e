"""Runs and control work on queues of their own, each served by its own worker processes: with every run slot
of two worker processes taken by a running job, a node check, a dispatch and a notification still happen
within seconds, and a job queued behind the runs is not stranded."""

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from console import services
from console.celery import app as celery_app
from jobs.logs import progress
from jobs.models import JobStatus, Node, TrainingJob, Webhook
from jobs.secret_box import seal_secret
from jobs.submission import task_queue
from jobs.submission.forms import TrainingJobForm
from jobs.submission.jobs import request_stop, submit_job
from tests.conftest import RUN_ID, TEST_NODE_WORK_ROOT, _worker_database_env
from tests.integration.helpers import TEST_OUTPUT, code_dir_from_program, wait_for

# A control task is done within this, however busy the runs are (it waits for no run to end).
PROMPT_SECONDS = 20


class Receiver:
    """A webhook receiver on loopback that records the events it is sent."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                receiver.events.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0")))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@pytest.fixture
def own_broker(tmp_path) -> Iterator[str]:
    """A Redis of this test's own: the session's worker (which serves both queues) must not take its tasks."""
    port = services.free_port()
    redis = services.start_redis(port, tmp_path / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    previous = celery_app.conf.broker_url
    settings.REDIS_URL = settings.CELERY_BROKER_URL = celery_app.conf.broker_url = url
    celery_app._pool = None
    celery_app.amqp._producer_pool = None
    progress._client.cache_clear()
    yield url
    settings.REDIS_URL = settings.CELERY_BROKER_URL = celery_app.conf.broker_url = previous
    celery_app._pool = None
    celery_app.amqp._producer_pool = None
    progress._client.cache_clear()
    services.stop(redis)


@pytest.fixture
def split_workers(console, own_broker) -> Iterator[list[Path]]:
    """Two worker processes of one run thread each (two run slots in all), and one for the control queue."""
    env = {**_worker_database_env(), "REDIS_URL": own_broker, "CELERY_BROKER_URL": own_broker,
           "NODE_WORK_ROOT": TEST_NODE_WORK_ROOT, "WORKER_PROBE_SECONDS": "2", "RUN_SLOTS": "2",
           "WEBHOOK_ALLOW_PRIVATE": "1"}
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    logs = [TEST_OUTPUT / f"celery-{name}-{RUN_ID}.log" for name in ("runs-a", "runs-b", "control")]
    processes = [
        services.start_celery_worker(env, logs[0], concurrency=1, queues="runs", name="runs-a"),
        services.start_celery_worker(env, logs[1], concurrency=1, queues="runs", name="runs-b"),
        services.start_celery_worker(env, logs[2], concurrency=2, queues="control", name="control"),
    ]
    run_slots, settings.RUN_SLOTS = settings.RUN_SLOTS, 2
    try:
        deadline = time.monotonic() + 90
        with celery_app.connection_for_write() as connection:
            while len(celery_app.control.ping(timeout=1.0, connection=connection)) < 3:
                assert time.monotonic() < deadline, "the three workers did not answer"
        yield logs
    finally:
        settings.RUN_SLOTS = run_slots
        for process in processes:
            services.stop(process)


def submitted(owner, name: str, program: str, **fields) -> TrainingJob:
    data = {"name": name, "engine": "local-mpi4py", "code_dir": program.removesuffix(".py"), "boot_file": program,
            "spec": "local-cpu", "node_count": 1, **fields}
    form = TrainingJobForm(data, user=owner)
    assert form.is_valid(), form.errors
    return submit_job(form, owner)


def within(seconds: float, condition, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < seconds, f"{what}: not within {seconds} s"
        time.sleep(0.2)
    return time.monotonic() - started


def test_control_work_goes_on_while_every_run_slot_is_taken_and_no_job_is_stranded(split_workers, console):
    owner = get_user_model().objects.create_user("queues-owner", password="queues-password")
    code_dir_from_program("hang", "hang.py")
    code_dir_from_program("numbered", "numbered.py")
    receiver = Receiver()
    Webhook.objects.create(user=owner, url=receiver.url, sealed_secret=seal_secret("s" * 32))
    runs = [submitted(owner, f"long-{index}", "hang.py", parameters=[{"name": "rank", "value": "-1"}])
            for index in range(2)]
    for job in runs:
        wait_for(job, [JobStatus.RUNNING], timeout=180)
    waiting = submitted(owner, "waits-its-turn", "numbered.py")

    # Both run slots are busy: each run worker's one thread follows a job. A node check, queued by name:
    node = Node.objects.filter(allocated_to__isnull=True).first() or console["nodes"][0]
    checked_before = Node.objects.get(pk=node.pk).last_checked_at
    task_queue.check_nodes_soon([node.pk])
    check_took = within(PROMPT_SECONDS, lambda: Node.objects.get(pk=node.pk).last_checked_at != checked_before,
                        "a node check while every run slot is taken")
    # A dispatch: the control worker looks at the queue (the waiting job stays Pending, its nodes free).
    control_log = split_workers[2]
    dispatched_before = control_log.read_text().count("jobs.tasks.dispatch_pending_jobs")
    task_queue.wake_dispatcher()
    dispatch_took = within(PROMPT_SECONDS, lambda: control_log.read_text().count(
        "jobs.tasks.dispatch_pending_jobs") > dispatched_before, "a dispatch while every run slot is taken")
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.PENDING and not waiting.allocated_nodes.exists(), "queued, holding no node"
    # A notification: a queued job stopped by its owner ends Terminated, and its owner's webhook hears of it.
    stopped = submitted(owner, "stopped-in-the-queue", "numbered.py")
    request_stop(stopped)
    notify_took = within(PROMPT_SECONDS, lambda: any(event["job"] and event["job"]["id"] == stopped.pk
                                                    for event in receiver.events),
                         "a notification while every run slot is taken")

    # A slot frees: the job that waited starts and completes (it was not stranded in a busy worker).
    for job in runs:
        request_stop(TrainingJob.objects.get(pk=job.pk))
    wait_for(waiting, [JobStatus.COMPLETED], timeout=240)
    for job in runs:
        wait_for(job, [JobStatus.TERMINATED], timeout=120)
    receiver.server.shutdown()
    print(f"with every run slot taken: node check {check_took:.1f} s, dispatch {dispatch_took:.1f} s, "
          f"notification {notify_took:.1f} s")
