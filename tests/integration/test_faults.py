"""Faults injected on the local cluster, each with the outcome it must have, checked on the nodes.

Every test here (and the fault tests elsewhere, by their `fault` marker) goes into the table of fault ->
outcome printed at the end of the run (tests/suite_tables.py).
"""

import asyncio
import http.client
import logging
import os
import random
import signal
import subprocess
import time

import pytest

from console import services
from jobs.models import FINAL_STATES, ApiToken, JobStatus, Node, TrainingJob, Worker
from jobs.tasks import check_nodes_now
from tests.conftest import CLUSTER_OPTIONS, RUN_ID, web_server_env
from tests.integration.helpers import (
    CLUSTER_NODES,
    CLUSTER_SLOTS,
    TEST_OUTPUT,
    _node_run,
    code_dir_from_program,
    log_text,
    submit_program,
    wait_for,
)
from tests.integration.test_log_streaming import (
    Follower,
    assert_every_rank_complete_and_in_order,
    submit_numbered_job,
    wait_for_lines,
)


def submit(api, name: str, program: str = "numbered.py", node_count: int = CLUSTER_NODES, **parameters) -> TrainingJob:
    code_dir_from_program(f"fault-{program.removesuffix('.py')}", program)
    response = api.post("/api/v1/training-jobs", {
        "name": name, "engine": "local-mpi4py", "spec": "local-cpu", "node_count": node_count,
        "code_dir": f"fault-{program.removesuffix('.py')}", "boot_file": program,
        "parameters": [{"name": key, "value": str(value)} for key, value in parameters.items()],
    }, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


def local_node(console, name: str):
    return next(node for node in console["cluster"] if node.name == name)


def containers_on(console, node_name: str) -> list[str]:
    output = asyncio.run(_node_run(local_node(console, node_name), "podman ps -a --format '{{.Names}}'"))
    return [line for line in output.split() if line.startswith("tc-")]


def whereabouts(job: TrainingJob) -> str:
    """What a job that did not end was last seen doing: its state, its run's owner and beat, its events and log."""
    events = "\n".join(f"  {event.at:%H:%M:%S.%f} {event.kind}: {event.message}" for event in job.events.order_by("at"))
    return (f"job {job.pk} {job.status} (run owner {job.run_owner or 'none'}, last beat {job.heartbeat_at}, "
            f"planned: {bool(job.sealed_ssh_key)})\n{events}\n{log_text(job)}")


def every_node_free_and_ready() -> bool:
    return not Node.objects.filter(allocated_to__isnull=False).exists() and \
        not Node.objects.exclude(state=Node.State.READY).exists()


def worker_of(job: TrainingJob, index: int) -> Worker:
    return Worker.objects.get(job=job, index=index)


@pytest.mark.fault("the Celery worker SIGKILLed mid-job, then restarted",
                   "the job completes; its log has every line once, in order")
def test_a_job_whose_celery_worker_is_killed_goes_on_and_completes_with_its_log_whole(api, console, celery_worker):
    job = submit_numbered_job(api, "worker-killed")
    wait_for(job, [JobStatus.RUNNING], timeout=120)
    wait_for_lines(job, 300)

    os.kill(celery_worker.process.pid, signal.SIGKILL)
    celery_worker.process.wait()
    time.sleep(2)  # the ranks go on printing into worker-0's files meanwhile
    celery_worker.start()

    job = wait_for(job, [JobStatus.COMPLETED], timeout=120)
    assert_every_rank_complete_and_in_order(job)
    assert job.log_lines.filter(text__startswith="Following the job again").count() == 1
    assert every_node_free_and_ready()


@pytest.mark.fault("a worker's container killed mid-job",
                   "the job fails at once, the card naming the worker and its node; every node freed")
def test_a_worker_whose_container_is_killed_mid_job_fails_the_job_naming_it(api, console):
    job = submit(api, "container-killed", count=100000, per_second=20)
    wait_for(job, [JobStatus.RUNNING], timeout=120)
    wait_for_lines(job, 10)
    worker = worker_of(job, 1)

    asyncio.run(_node_run(local_node(console, worker.node_name), f"podman kill {worker.container_name}"))
    killed = time.monotonic()

    job = wait_for(job, [JobStatus.FAILED], timeout=60)
    assert time.monotonic() - killed < 30
    assert job.status_message.startswith(f"worker-1 ({worker.node_name}) was lost mid-run: its container")
    assert job.failure["kind"] == "node_lost" and worker.node_name in job.failure["title"]
    assert all(not containers_on(console, node.name) for node in console["cluster"])
    assert every_node_free_and_ready()


@pytest.mark.fault("a node's network cut mid-job, then restored",
                   "the job fails within NODE_LOST_SECONDS naming the node; once back, the node is cleaned and Ready")
def test_a_node_cut_off_mid_job_fails_it_promptly_and_is_cleaned_when_it_answers_again(api, console, settings):
    job = submit(api, "network-cut", count=100000, per_second=20)
    wait_for(job, [JobStatus.RUNNING], timeout=120)
    wait_for_lines(job, 10)
    worker = worker_of(job, 1)
    veth = f"{CLUSTER_OPTIONS['prefix']}{worker.node_name.removeprefix('node-')}h"

    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    cut = time.monotonic()
    try:
        job = wait_for(job, [JobStatus.FAILED], timeout=120)
        took = time.monotonic() - cut
        node = Node.objects.get(name=worker.node_name)
        assert node.state == Node.State.NOT_READY, "the node that could not be cleaned is kept out of service"
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    assert took < settings.NODE_LOST_SECONDS + 30, f"the job took {took:.0f} s to fail"
    assert job.status_message.startswith(f"worker-1 ({worker.node_name}) was lost mid-run: its node has not answered")
    assert job.failure["kind"] == "node_lost" and worker.node_name in job.failure["title"]

    deadline = time.monotonic() + 60
    while not (results := check_nodes_now([node]))[0].ready:
        assert time.monotonic() < deadline, f"the node is still not ready: {results[0].message}"
        time.sleep(2)
    assert containers_on(console, worker.node_name) == [], "what the job left was removed once the node answered"
    assert every_node_free_and_ready()


@pytest.mark.fault("stop in Pending, Creating and Running",
                   "each ends Terminated, no container left, every node freed")
def test_a_stop_in_each_live_state_ends_terminated(api, console):
    running = submit(api, "stop-running", count=100000, per_second=20)
    wait_for(running, [JobStatus.RUNNING], timeout=120)
    queued = submit(api, "stop-pending", count=10)
    assert TrainingJob.objects.get(pk=queued.pk).status == JobStatus.PENDING

    assert api.post(f"/api/v1/training-jobs/{queued.pk}/stop").status_code in (200, 202)
    assert api.post(f"/api/v1/training-jobs/{running.pk}/stop").status_code in (200, 202)
    creating = submit(api, "stop-creating", count=100000, per_second=20)
    wait_for(creating, [JobStatus.CREATING], timeout=60)
    assert api.post(f"/api/v1/training-jobs/{creating.pk}/stop").status_code in (200, 202)

    for job in (queued, running, creating):
        assert wait_for(job, [JobStatus.TERMINATED], timeout=90).status == JobStatus.TERMINATED
    assert all(not containers_on(console, node.name) for node in console["cluster"])
    assert every_node_free_and_ready()


@pytest.mark.fault("20 submit-then-stop races", "0 stuck: every job ends Terminated, every node freed")
def test_twenty_jobs_stopped_moments_after_their_submission_all_end_and_free_their_nodes(api, console):
    chance = random.Random(RUN_ID)
    jobs = []
    for number in range(20):
        job = submit(api, f"race-{number}", node_count=1, count=100000, per_second=20)
        time.sleep(chance.uniform(0, 1.2))
        assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code in (200, 202, 409)
        jobs.append(job)

    deadline = time.monotonic() + 240
    while TrainingJob.objects.filter(pk__in=[job.pk for job in jobs]).exclude(status__in=FINAL_STATES).exists():
        stuck = list(TrainingJob.objects.filter(pk__in=[job.pk for job in jobs]).exclude(status__in=FINAL_STATES))
        assert time.monotonic() < deadline, "jobs still not ended:\n" + "\n".join(map(whereabouts, stuck))
        time.sleep(0.5)
    assert set(TrainingJob.objects.filter(pk__in=[job.pk for job in jobs]).values_list("status", flat=True)) == {
        JobStatus.TERMINATED}
    assert all(not containers_on(console, node.name) for node in console["cluster"])
    assert every_node_free_and_ready()


class PatientFollower(Follower):
    """A follower that, like a browser's EventSource, tries again while the server is away."""

    def follow_once(self) -> None:
        try:
            super().follow_once()
        except (ConnectionError, http.client.HTTPException, OSError):
            time.sleep(0.2)


def start_web_server(port: int, redis_url: str) -> subprocess.Popen:
    return services.start_web_server(port, web_server_env(redis_url), TEST_OUTPUT / f"uvicorn-faults-{RUN_ID}.log")


@pytest.mark.fault("the web server restarted while a client follows the log (SSE)",
                   "the client resumes with Last-Event-ID: every line once, none missing")
def test_a_follower_of_the_log_resumes_across_a_web_server_restart_without_gap_or_duplicate(
        api, owner, console, redis_url):
    port = services.free_port()
    server = start_web_server(port, redis_url)
    _, token = ApiToken.issue(owner, "faults")
    job = submit(api, "web-restart", count=4000, per_second=250)
    follower = PatientFollower(port, job.pk, token)
    follower.start()
    try:
        wait_for_lines(job, 1000)
        server.kill()  # a crash, not a shutdown that waits for the stream to end
        server.wait()
        time.sleep(1)
        server = start_web_server(port, redis_url)
        job = wait_for(job, [JobStatus.COMPLETED], timeout=120)
        follower.join(timeout=60)
    finally:
        services.stop(server)
    assert follower.error is None, follower.error
    assert follower.connections >= 2, "the follower never had to reconnect"
    assert [line["seq"] for line in follower.lines] == list(range(1, job.log_line_count + 1))
    for rank in range(CLUSTER_NODES * CLUSTER_SLOTS):
        numbers = [int(line["text"].split()[2]) for line in follower.lines if line["text"].startswith(f"SEQ {rank} ")]
        assert numbers == list(range(4000)), f"rank {rank}: {len(numbers)} lines, not 0..3999 once each in order"


@pytest.mark.fault("a stop whose task never reaches a worker (the broker was away)",
                   "the job's run ends its containers itself: Terminated, nothing left, nodes freed")
def test_a_stop_whose_task_was_lost_is_carried_out_by_the_jobs_run(api, console):
    job = submit(api, "stop-lost", count=100000, per_second=20)
    wait_for(job, [JobStatus.RUNNING], timeout=120)

    TrainingJob.objects.get(pk=job.pk).terminate()  # the state changes; no stop task is queued

    assert wait_for(job, [JobStatus.TERMINATED], timeout=60).status == JobStatus.TERMINATED
    assert all(not containers_on(console, node.name) for node in console["cluster"])
    assert every_node_free_and_ready()


@pytest.mark.fault("a submission while the broker (Redis) is down, and one retried with the same Idempotency-Key",
                   "the first is kept and runs once Redis is back; the retry returns the first job (200), nothing doubled")
def test_a_submission_made_without_a_broker_runs_later_and_a_retried_one_returns_the_first_job(
        api, console, redis_server, celery_worker, caplog):
    code_dir_from_program("fault-numbered", "numbered.py")
    body = {"name": "no-broker", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 1,
            "code_dir": "fault-numbered", "boot_file": "numbered.py",
            "parameters": [{"name": "count", "value": "10"}]}
    redis_server.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="jobs.submission.task_queue"):
            offline = api.post("/api/v1/training-jobs", body, format="json")
    finally:
        redis_server.restart()
        celery_worker.restart()  # a Redis that went away ends the worker (see CeleryWorker)
    assert offline.status_code == 201, offline.content
    assert "could not queue jobs.tasks.dispatch_pending_jobs" in caplog.text, "the broker answered: nothing was tested"
    assert TrainingJob.objects.get(pk=offline.json()["id"]).status == JobStatus.PENDING

    first = api.post("/api/v1/training-jobs", {**body, "name": "idempotent"}, format="json",
                     HTTP_IDEMPOTENCY_KEY="retry-1")
    again = api.post("/api/v1/training-jobs", {**body, "name": "idempotent"}, format="json",
                     HTTP_IDEMPOTENCY_KEY="retry-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and again["Idempotent-Replayed"] == "true"
    assert TrainingJob.objects.filter(name="idempotent").count() == 1
    # The dispatch the first submission queued also takes the one made while Redis was down.
    for job_id in (offline.json()["id"], first.json()["id"]):
        assert wait_for(TrainingJob.objects.get(pk=job_id), [JobStatus.COMPLETED], timeout=120)


@pytest.mark.fault("a worker lost mid-job, with auto restart on (1)",
                   "attempt 2 runs on healthy nodes with MA_RESTART_COUNT=1 and completes; both attempts' logs kept")
def test_a_job_with_auto_restart_whose_worker_is_lost_runs_again_and_completes(api, console):
    code_dir_from_program("fault-resumable", "resumable.py")
    response = api.post("/api/v1/training-jobs", {
        "name": "restarted", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": CLUSTER_NODES,
        "code_dir": "fault-resumable", "boot_file": "resumable.py", "max_restarts": 1}, format="json")
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get(pk=response.json()["id"])
    wait_for(job, [JobStatus.RUNNING], timeout=120)
    ranks = CLUSTER_NODES * CLUSTER_SLOTS
    deadline = time.monotonic() + 60
    while job.log_lines.filter(text__startswith="ATTEMPT").count() < ranks:
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.2)
    worker = worker_of(job, 1)

    asyncio.run(_node_run(local_node(console, worker.node_name), f"podman kill {worker.container_name}"))

    job = wait_for(job, [JobStatus.COMPLETED], timeout=180)
    assert (job.restart_count, job.exit_code) == (1, 0)
    attempts = [line.text for line in job.log_lines.filter(text__startswith="ATTEMPT").order_by("seq")]
    assert sorted(attempts[:ranks]) == [f"ATTEMPT rank={rank} restarts=0" for rank in range(ranks)]
    assert sorted(attempts[ranks:]) == [f"ATTEMPT rank={rank} restarts=1" for rank in range(ranks)]
    [boundary] = job.attempt_log_starts
    assert job.log_lines.filter(seq__gt=boundary, text__startswith="RESUMED").count() == ranks
    assert job.log_lines.filter(seq__lte=boundary, text__startswith="working").exists()
    assert job.events.filter(kind="restarted").count() == 1
    assert every_node_free_and_ready()


@pytest.mark.fault("a rank raises while the other ranks wait in a barrier (mpi4py finalizes, it does not abort)",
                   "the page says so at once; the job fails its grace later (its own 3 s here, not "
                   "RANK_EXIT_GRACE_SECONDS), its card naming the rank")
def test_a_rank_that_dies_while_the_others_wait_is_said_at_once_and_fails_the_job_after_the_grace(api, console):
    job = wait_for(submit_program(api, "rank_dies_alone.py", max_restarts=1, rank_exit_grace_seconds=3),
                   [JobStatus.FAILED], timeout=240)

    said = [event.message for event in job.events.filter(kind="rank-ended").order_by("id")]
    assert said and said[0].startswith("Rank 0 (worker-0, ") and "raised PermissionError" in said[0], said
    assert "the other ranks are still running" in said[0]
    assert "did not end within 3 s" in said[-1], said
    assert job.failure["rank"] == 0 and "PermissionError" in job.failure["title"] + job.failure.get("exception", ""), \
        job.failure
    assert job.restart_count == 0, "a rank's own error is not restarted"
    assert not job.log_lines.filter(text__startswith="passed the barrier").exists()
    ended = job.events.filter(kind=f"state:{JobStatus.FAILED}").get().at
    first_said = job.events.filter(kind="rank-ended").order_by("id").first().at
    assert 2 <= (ended - first_said).total_seconds() < 60, (first_said, ended)
    assert every_node_free_and_ready()
