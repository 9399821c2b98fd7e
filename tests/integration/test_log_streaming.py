"""A job's log on the local cluster, end to end: every rank's numbered lines are stored once and in order,
and a client following the log through the web server (uvicorn, Server-Sent Events) gets each stored
line exactly once, also when it reconnects midway and when Redis is restarted midway."""

import http.client
import json
import threading
import time

import pytest

from console import services
from jobs.models import ApiToken, JobStatus, TrainingJob
from tests.conftest import RUN_ID, web_server_env
from tests.integration.helpers import (
    CLUSTER_NODES,
    CLUSTER_SLOTS,
    TEST_OUTPUT,
    code_dir_from_program,
    wait_for,
)

RANKS = CLUSTER_NODES * CLUSTER_SLOTS
COUNT = 2500  # numbers per rank
PER_SECOND = 700  # per rank: the output takes a few seconds, long enough to act in the middle of it


@pytest.fixture(scope="module")
def web_server(celery_worker, redis_url):
    """The console's web server on the test database, as `runconsole` serves it."""
    port = services.free_port()
    process = services.start_web_server(port, web_server_env(redis_url), TEST_OUTPUT / f"uvicorn-{RUN_ID}.log")
    try:
        yield port
    finally:
        services.stop(process)


class Follower(threading.Thread):
    """A client of /log/events that hangs up after each count in `hang_up_after` line events and
    reconnects with Last-Event-ID, as a browser's EventSource does, until the stream ends."""

    def __init__(self, port: int, job_id: int, token: str, query: str = "", hang_up_after=()):
        super().__init__(daemon=True)
        self.port, self.job_id, self.token, self.query = port, job_id, token, query
        self.hang_up_after = sorted(hang_up_after)
        self.lines: list[dict] = []
        self.connections = 0
        self.last_id: str | None = None
        self.ended: dict | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while self.ended is None:
                self.follow_once()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error

    def follow_once(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        headers = {"Authorization": f"Token {self.token}", "Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = self.last_id
        connection.request("GET", f"/api/v1/training-jobs/{self.job_id}/log/events{self.query}", headers=headers)
        response = connection.getresponse()
        assert response.status == 200, response.read()
        self.connections += 1
        event: dict = {}
        try:
            while True:
                raw = response.readline()
                if not raw:
                    return  # the server hung up; reconnect
                line = raw.decode().rstrip("\n")
                if line:
                    name, _, value = line.partition(": ")
                    event[name] = value
                    continue
                self.take(event)
                event = {}
                if self.ended is not None:
                    return
                if self.hang_up_after and len(self.lines) >= self.hang_up_after[0]:
                    self.hang_up_after.pop(0)
                    return
        finally:
            connection.close()

    def take(self, event: dict) -> None:
        if "id" in event:
            self.last_id = event["id"]
        kind = event.get("event")
        if kind is None and "data" in event:
            self.lines.append(json.loads(event["data"]))
        elif kind == "end":
            self.ended = json.loads(event["data"])


def submit_numbered_job(api, name: str) -> TrainingJob:
    code_dir_from_program(f"numbered-{name}", "numbered.py")
    response = api.post("/api/v1/training-jobs", {
        "name": name, "engine": "local-mpi4py", "spec": "local-cpu", "node_count": CLUSTER_NODES,
        "code_dir": f"numbered-{name}", "boot_file": "numbered.py",
        "parameters": [{"name": "count", "value": str(COUNT)}, {"name": "per_second", "value": str(PER_SECOND)}],
    }, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


def assert_every_rank_complete_and_in_order(job: TrainingJob) -> list:
    lines = list(job.log_lines.order_by("seq"))
    assert [line.seq for line in lines] == list(range(1, job.log_line_count + 1)), "sequence numbers have gaps"
    for rank in range(RANKS):
        for prefix, numbers in (("SEQ", range(COUNT)), ("ERRSEQ", range(0, COUNT, 10))):
            got = [int(line.text.split()[2]) for line in lines if line.text.startswith(f"{prefix} {rank} ")]
            assert got == list(numbers), f"rank {rank} {prefix}: {len(got)} lines, not 0..{COUNT - 1} once each in order"
            owners = {(line.rank, line.worker_index) for line in lines if line.text.startswith(f"{prefix} {rank} ")}
            assert owners == {(rank, rank // CLUSTER_SLOTS)}
    return lines


def wait_for_lines(job: TrainingJob, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while TrainingJob.objects.values_list("log_line_count", flat=True).get(pk=job.pk) < count:
        assert time.monotonic() < deadline, f"fewer than {count} lines after {timeout} s"
        time.sleep(0.05)


def finish(followers, job) -> None:
    for follower in followers:
        follower.join(timeout=60)
        assert not follower.is_alive(), "a follower did not see the end of the stream"
        assert follower.error is None, follower.error
        assert follower.ended == {"status": "Completed", "next": job.log_line_count}


def test_followers_that_hang_up_midway_resume_and_get_every_line_once_and_the_store_has_each_rank_in_order(
        api, owner, web_server):
    token = ApiToken.issue(owner, "test")[1]
    job = submit_numbered_job(api, "reconnect")
    everything = Follower(web_server, job.pk, token, hang_up_after=[1500, 6000])
    worker_1 = Follower(web_server, job.pk, token, query="?worker=1&system=0", hang_up_after=[700, 2000])
    for follower in (everything, worker_1):
        follower.start()

    job = wait_for(job, [JobStatus.COMPLETED], timeout=180)
    finish([everything, worker_1], job)

    stored = assert_every_rank_complete_and_in_order(job)
    assert everything.connections == 3 and worker_1.connections == 3
    assert [line["seq"] for line in everything.lines] == [line.seq for line in stored]
    assert [line["text"] for line in everything.lines] == [line.text for line in stored]
    on_worker_1 = [line.seq for line in stored if line.worker_index == 1 and line.stream != "system"]
    assert [line["seq"] for line in worker_1.lines] == on_worker_1
    assert len(on_worker_1) == (RANKS // CLUSTER_NODES) * (COUNT + COUNT // 10)


@pytest.fixture
def restartable_redis(redis_server, celery_worker):
    yield redis_server
    celery_worker.restart()  # the Redis restart ends it once its job is done (see CeleryWorker)


@pytest.mark.fault("Redis restarted mid-job", "no log line lost or doubled, in the store or for a follower")
def test_a_redis_restart_midway_loses_no_line_for_the_store_or_a_follower(api, owner, web_server, restartable_redis):
    token = ApiToken.issue(owner, "test")[1]
    job = submit_numbered_job(api, "redis-restart")
    follower = Follower(web_server, job.pk, token)
    follower.start()

    wait_for_lines(job, RANKS * COUNT // 4)
    restartable_redis.restart()
    restarted_at = TrainingJob.objects.values_list("log_line_count", flat=True).get(pk=job.pk)

    job = wait_for(job, [JobStatus.COMPLETED], timeout=180)
    finish([follower], job)
    stored = assert_every_rank_complete_and_in_order(job)
    assert restarted_at < len(stored) - RANKS * COUNT // 4, "Redis came back after the output was over"
    assert [line["seq"] for line in follower.lines] == [line.seq for line in stored]
    assert follower.connections == 1
