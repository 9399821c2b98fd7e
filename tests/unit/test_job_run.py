"""A job's run on its nodes (JobRun), with SSH the only thing faked.

The steps that reach the nodes (preparation, the launch on worker-0, the teardown, the outputs) are
replaced where the run calls them, by fakes that answer as the nodes would. Everything else is the
real run: the database, the job's transitions, the log's service lines, the monitor beside the
launch, the "why it failed" card, and the nodes given back (or kept out of service).

JobRun does its database work on a thread of its own (sync_to_async), so these tests commit
(transaction=True) for that thread to see what a test wrote.
"""

import asyncio

import pytest
from asgiref.sync import sync_to_async

from jobs.allocation import try_allocate
from jobs.logs.store import LogRecord
from jobs.models import JobStatus, LogStream, Node, TrainingJob, WorkerState
from jobs.runtime import run
from jobs.runtime.preparation import ContainerStarted
from jobs.runtime.run import JobRun, in_own_context, plan_allocated_job
from jobs.runtime.ssh import NodeError
from jobs.runtime.teardown import TeardownResult
from tests.unit.log_helpers import quiet_redis  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("quiet_redis")]

CLEAN = "container removed, no process left"


class FakeNodes:
    """The job's nodes as the run reaches them over SSH: what each step was asked, and what it answers.

    Preparation reports each worker's progress through the run's callback, as the real one does.
    """

    def __init__(self, monkeypatch):
        self.preparation_failure: tuple[int, NodeError] | None = None
        self.while_preparing = None  # a database step run while the containers start (a user's stop)
        self.output: list[LogRecord] = []  # what mpirun prints, stored through the run's log sink
        self.exit_status: int | None = 0  # None: the session was cut before mpirun ended
        self.unreachable: dict[int, str] = {}  # worker index -> why the teardown could not reach it
        self.prepared: list[int] = []
        self.launches = 0
        self.teardowns: list[list[int]] = []
        monkeypatch.setattr(run, "prepare_all", self.prepare_all)
        monkeypatch.setattr(run, "launch", self.launch)
        monkeypatch.setattr(run, "teardown_all", self.teardown_all)
        monkeypatch.setattr(run, "collect_outputs", self.collect_outputs)

    async def prepare_all(self, plan, report):
        for worker in plan.workers:
            await report(worker.index, WorkerState.PREPARING,
                         f"preparing worker-{worker.index} on {worker.node.label} ({worker.address})")
        if self.while_preparing:
            await sync_to_async(self.while_preparing)(plan.job_id)
        failed_index, error = self.preparation_failure or (None, None)
        for worker in plan.workers:
            if worker.index == failed_index:
                await report(worker.index, WorkerState.FAILED, str(error))
            else:
                self.prepared.append(worker.index)
                await report(worker.index, WorkerState.READY, f"worker-{worker.index} container is up")
        if error:
            raise error
        return [ContainerStarted(worker.index, f"container-{worker.index}") for worker in plan.workers]

    async def launch(self, plan, sink):
        self.launches += 1
        async with sink:
            await sink.add_many(self.output)
        return self.exit_status

    async def teardown_all(self, workers):
        self.teardowns.append([worker.index for worker in workers])
        return [TeardownResult(worker.index, None, self.unreachable[worker.index]) if worker.index in self.unreachable
                else TeardownResult(worker.index, 0) for worker in workers]

    async def collect_outputs(self, *args):
        raise AssertionError("a job without train_url has no outputs to collect")


@pytest.fixture
def nodes(monkeypatch):
    return FakeNodes(monkeypatch)


@pytest.fixture
def job(make_job):
    """A job of 2 workers whose nodes are allocated: worker-0 on node-a, worker-1 on node-b, in state Creating."""
    # The options a job copies from the launcher defaults; rank placement is read from them.
    job = make_job(name="train", node_count=2, bind_args="-bind-to none -map-by slot")
    for name, address in (("node-a", "10.0.0.1"), ("node-b", "10.0.0.2")):
        Node.objects.create(name=name, address=address, spec=job.spec)
    assert try_allocate(job)
    assert job.status == JobStatus.CREATING
    return job


def run_job(job: TrainingJob) -> TrainingJob:
    """Plan the job and run it, as the Celery task does; the job as it ended."""
    plan = plan_allocated_job(job)
    asyncio.run(in_own_context(JobRun(plan).execute()))
    job.refresh_from_db()
    return job


def service_lines(job: TrainingJob) -> list[tuple[int | None, str]]:
    return list(job.log_lines.filter(stream=LogStream.SYSTEM).order_by("seq").values_list("worker_index", "text"))


def worker_states(job: TrainingJob) -> list[tuple[str, str]]:
    return list(job.workers.order_by("index").values_list("state", "message"))


def node(name: str) -> Node:
    return Node.objects.get(name=name)


PREPARING = [
    (None, "Preparing 2 worker(s)"),
    (0, "preparing worker-0 on node-a (10.0.0.1)"),
    (1, "preparing worker-1 on node-b (10.0.0.2)"),
]
READY = [(0, "worker-0 container is up"), (1, "worker-1 container is up")]
TORN_DOWN = [(0, f"worker-0: {CLEAN}"), (1, f"worker-1: {CLEAN}")]
STOPPED_WORKERS = [(WorkerState.STOPPED, f"worker-0: {CLEAN}"), (WorkerState.STOPPED, f"worker-1: {CLEAN}")]


def test_a_job_whose_preparation_fails_on_one_worker_fails_and_frees_every_node(nodes, job):
    error = NodeError("node-b", "starting the container", "exit status 1: boom")
    nodes.preparation_failure = (1, error)

    job = run_job(job)

    message = "node-b: starting the container failed: exit status 1: boom"
    assert str(error) == message
    assert (job.status, job.status_message, job.exit_code) == (JobStatus.FAILED, message, None)
    assert job.failure["kind"] == "preparation" and job.failure["title"] == message
    assert nodes.launches == 0
    assert nodes.teardowns == [[0, 1]], "every worker's container is ended, the failed one's too"
    assert [(item.name, item.allocated_to, item.state) for item in Node.objects.order_by("name")] == [
        ("node-a", None, Node.State.READY), ("node-b", None, Node.State.READY)]
    assert worker_states(job) == [(WorkerState.STOPPED, f"worker-0: {CLEAN}"), (WorkerState.FAILED, message)], \
        "the worker that failed still says why after the teardown"
    assert service_lines(job) == [*PREPARING, (0, "worker-0 container is up"), (1, message), (None, message),
                                  (0, f"worker-0: {CLEAN}"), (1, "worker-1: container removed after its failed preparation")]


def test_a_job_stopped_while_its_containers_start_is_never_launched_and_ends_terminated(nodes, job):
    nodes.while_preparing = lambda job_id: TrainingJob.objects.get(pk=job_id).terminate()

    job = run_job(job)

    assert (job.status, job.status_message, job.exit_code) == (JobStatus.TERMINATED, "Stopped by the user", None)
    assert job.failure == {}
    assert nodes.launches == 0
    assert nodes.teardowns == [[0, 1]]
    assert [kind for kind in job.events.values_list("kind", flat=True)] == [
        "state:Creating", "state:Terminating", "state:Terminated"]
    assert not Node.objects.filter(allocated_to__isnull=False).exists()
    assert worker_states(job) == STOPPED_WORKERS
    assert service_lines(job) == [*PREPARING, *READY, (None, "Stopped before the launch: ending the containers"),
                                  *TORN_DOWN]


def test_a_job_whose_launch_session_is_cut_ends_abnormal_and_says_so(nodes, job):
    nodes.exit_status = None

    job = run_job(job)

    message = "the launch session on worker-0 was cut"
    assert (job.status, job.status_message, job.exit_code) == (JobStatus.ABNORMAL, message, None)
    assert job.failure["kind"] == "abnormal" and job.failure["title"] == message
    assert nodes.launches == 1 and nodes.teardowns == [[0, 1]]
    assert not Node.objects.filter(allocated_to__isnull=False).exists()
    assert worker_states(job) == STOPPED_WORKERS
    assert service_lines(job) == [*PREPARING, *READY, (None, "Launching: mpirun on worker-0"),
                                  (None, "The launch session on worker-0 was cut before mpirun ended"), *TORN_DOWN]


def test_a_node_that_cannot_be_reached_after_mpirun_fails_is_named_as_lost_and_kept_out_of_service(nodes, job):
    lost = "node-b: SSH to 10.0.0.2:22 failed: timed out"
    nodes.exit_status = 255
    nodes.unreachable = {1: lost}

    job = run_job(job)

    assert (job.status, job.status_message, job.exit_code) == (
        JobStatus.FAILED, "Training end with return code: 255", 255)
    assert job.failure["kind"] == "node_lost"
    assert job.failure["title"] == "A node was lost mid-job: node-b"
    assert f"worker-1: {lost}" in job.failure["hints"]
    assert not Node.objects.filter(allocated_to__isnull=False).exists()
    assert (node("node-a").state, node("node-a").state_message) == (Node.State.READY, "")
    assert (node("node-b").state, node("node-b").state_message) == (Node.State.NOT_READY, f"after job {job.pk}: {lost}")
    assert worker_states(job) == [(WorkerState.STOPPED, f"worker-0: {CLEAN}"), (WorkerState.UNCLEAN, f"worker-1: {lost}")]
    assert job.cleanup_report["clean"] is False
    assert [(item["node"], item["clean"], item["problem"]) for item in job.cleanup_report["workers"]] == [
        ("node-a", True, ""), ("node-b", False, lost)]
    assert service_lines(job) == [*PREPARING, *READY, (None, "Launching: mpirun on worker-0"),
                                  (None, "Training end with return code: 255"),
                                  (0, f"worker-0: {CLEAN}"), (1, f"worker-1: {lost}")]


def test_a_job_whose_mpirun_exits_0_completes_with_its_output_kept_and_its_workers_stopped(nodes, job):
    nodes.output = [LogRecord(text="step 1 loss=0.5", stream=LogStream.STDOUT, rank=0, worker_index=0),
                    LogRecord(text="step 1 loss=0.5", stream=LogStream.STDOUT, rank=2, worker_index=1)]

    job = run_job(job)

    assert (job.status, job.status_message, job.exit_code) == (
        JobStatus.COMPLETED, "Training end with return code: 0", 0)
    assert job.started_at is not None and job.ended_at is not None
    assert job.failure == {}
    assert job.heartbeat_at is not None
    assert [kind for kind in job.events.values_list("kind", flat=True)] == [
        "state:Creating", "state:Running", "state:Completed"]
    assert nodes.prepared == [0, 1] and nodes.launches == 1 and nodes.teardowns == [[0, 1]]
    assert [(item.name, item.allocated_to, item.state) for item in Node.objects.order_by("name")] == [
        ("node-a", None, Node.State.READY), ("node-b", None, Node.State.READY)]
    assert worker_states(job) == STOPPED_WORKERS
    assert job.cleanup_report["clean"] is True
    assert list(job.log_lines.filter(stream=LogStream.STDOUT).values_list("rank", "text")) == [
        (0, "step 1 loss=0.5"), (2, "step 1 loss=0.5")]
    assert job.final_metrics == {"loss": 0.5}, "the monitor read the launch's lines"
    assert service_lines(job) == [*PREPARING, *READY, (None, "Launching: mpirun on worker-0"),
                                  (None, "Training end with return code: 0"), *TORN_DOWN]


def test_a_job_whose_failure_card_cannot_be_recorded_still_ends_and_frees_its_nodes(nodes, job, monkeypatch):
    def broken_card(*args):
        raise RuntimeError("the card could not be written")

    monkeypatch.setattr(run, "record_failure", broken_card)
    nodes.exit_status = 3

    job = run_job(job)

    assert (job.status, job.exit_code) == (JobStatus.FAILED, 3)
    assert not Node.objects.filter(allocated_to__isnull=False).exists()


def test_a_job_stopped_after_its_nodes_were_given_but_before_its_run_began_ends_terminated_and_frees_them(nodes, job):
    TrainingJob.objects.get(pk=job.pk).terminate()

    run.run_allocated_job(job.pk)

    job.refresh_from_db()
    assert job.status == JobStatus.TERMINATED
    assert nodes.prepared == [] and nodes.launches == 0
    assert not Node.objects.filter(allocated_to__isnull=False).exists()


def test_the_heartbeat_survives_any_error_of_its_database_step(monkeypatch):
    import threading

    calls = []

    def broken(job_id):
        calls.append(job_id)
        raise RuntimeError("not a database error")

    monkeypatch.setattr(run, "HEARTBEAT_SECONDS", 0.02)
    monkeypatch.setattr(run, "_touch_heartbeat", broken)

    still_beating = []

    async def beating():
        task = asyncio.create_task(JobRun(type("Plan", (), {"job_id": 1})()).beat())
        await asyncio.sleep(0.2)
        still_beating.append(not task.done())
        task.cancel()

    thread = threading.Thread(target=lambda: asyncio.run(in_own_context(beating())))
    thread.start()
    thread.join()
    assert still_beating == [True], "the heartbeat died"
    assert len(calls) >= 3
