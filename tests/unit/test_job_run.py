"""A job's run on its nodes (JobRun), with SSH the only thing faked.

The steps that reach the nodes (preparation, the launch on worker-0, the teardown, the outputs) are
replaced where the run calls them, by fakes that answer as the nodes would. Everything else is the
real run: the database, the job's transitions, the log's service lines, the monitor beside the
launch, the "why it failed" card, and the nodes given back (or kept out of service).

JobRun does its database work on a thread of its own (sync_to_async), so these tests commit
(transaction=True) for that thread to see what a test wrote.
"""

import asyncio
import re
import time

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from jobs.allocation import try_allocate
from jobs.logs.store import LogRecord
from jobs.models import JobStatus, LogStream, Node, TrainingJob, WorkerState
from jobs.runtime import run
from jobs.runtime.liveness import RankEnd
from jobs.runtime.monitor import MONITOR_INTERVAL_SECONDS
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
        monkeypatch.setattr(run, "WorkerWatch", self.worker_watch)
        # The evidence of a failure is the control queue's (jobs.tasks.take_evidence): no broker here, no wait for it.
        monkeypatch.setattr(run, "queue_evidence", lambda job_id, reason: False)
        self.lose: dict[int, str] = {}  # workers the watch finds lost while mpirun runs
        self.rank_ends: dict[int, RankEnd] = {}  # ranks the watch finds ended (as 0: finished) while the others run
        self.silent: frozenset[int] = frozenset()  # those of them whose node stopped answering

    async def prepare_all(self, plan, report, inputs=()):
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

    async def launch(self, plan, sink, cursor=None, stopping=None, patience=None):
        self.launches += 1
        self.cursor = cursor
        async with sink:
            await sink.add_many(self.output)
            if self.lose:
                await self.on_lost(self.lose, self.silent)
                await stopping.wait()
            if self.rank_ends:
                await self.on_rank_end(self.rank_ends)
                if not all(end.finished for end in self.rank_ends.values()):
                    await stopping.wait()  # until the run ends the containers, which ends mpirun
        return self.exit_status

    def worker_watch(self, workers, on_lost, on_usage=None, on_rank_end=None):
        """The watch, idle: the fake launch reports the workers in `lose` lost through its callback."""
        self.on_lost = on_lost
        self.on_rank_end = on_rank_end

        class Idle:
            workers: list = []

            async def run(self):
                await asyncio.Event().wait()

            async def probe(self, worker):
                raise AssertionError("the idle watch has no worker to probe")

            def close(self):
                pass

            async def gone_workers(self):
                return {}

        return Idle()

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
    assert job.failure["others"] == [], "no rank started: none is said to have left no record"
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
    assert [kind for kind in job.events.values_list("kind", flat=True) if kind.startswith("state:")] == [
        "state:Creating", "state:Terminating", "state:Terminated"]
    assert not Node.objects.filter(allocated_to__isnull=False).exists()
    assert worker_states(job) == STOPPED_WORKERS
    assert service_lines(job) == [*PREPARING, *READY, (None, "Stopped before the launch: ending the containers"),
                                  *TORN_DOWN]


def test_a_job_whose_mpirun_ends_without_an_exit_status_ends_abnormal_and_says_so(nodes, job):
    nodes.exit_status = None

    job = run_job(job)

    message = "mpirun on worker-0 ended without an exit status"
    assert (job.status, job.status_message, job.exit_code) == (JobStatus.ABNORMAL, message, None)
    assert job.failure["kind"] == "abnormal" and job.failure["title"] == message
    assert nodes.launches == 1 and nodes.teardowns == [[0, 1]]
    assert not Node.objects.filter(allocated_to__isnull=False).exists()
    assert worker_states(job) == STOPPED_WORKERS
    assert service_lines(job) == [*PREPARING, *READY, (None, "Launching: mpirun on worker-0"), (None, message),
                                  *TORN_DOWN]


def test_a_worker_lost_mid_run_fails_the_job_with_the_card_naming_the_worker_and_its_node(nodes, job):
    nodes.exit_status = None
    nodes.lose = {1: "its container job-x-worker-1 is gone"}

    job = run_job(job)

    message = "worker-1 (node-b) was lost mid-run: its container job-x-worker-1 is gone"
    assert (job.status, job.status_message) == (JobStatus.FAILED, message)
    assert job.failure["kind"] == "node_lost" and job.failure["title"] == "A node was lost mid-job: node-b"
    assert "worker-1: its container job-x-worker-1 is gone" in job.failure["hints"]
    assert nodes.teardowns == [[0, 1]], "the others are ended at once, and that teardown is the run's last"
    assert not Node.objects.filter(allocated_to__isnull=False).exists()
    assert (1, "worker-1 (node-b) was lost: its container job-x-worker-1 is gone; ending the job's other containers") \
        in service_lines(job)


def test_a_rank_that_ended_while_the_others_run_is_said_at_once_and_the_job_fails_after_the_grace(
        nodes, job, settings):
    settings.RANK_EXIT_GRACE_SECONDS = 1.0
    nodes.exit_status = 1
    # Its record's time is the job's own: one ahead of now is taken as now; ranks outside the plan are not taken.
    ahead = time.time() + 3600
    nodes.rank_ends = {0: RankEnd(0, 0, "ended with exit code 1", ahead), 99: RankEnd(99, 1, "ended with exit code 1", 0.0)}
    job.max_restarts = 1
    job.save(update_fields=["max_restarts"])

    started = time.monotonic()
    job = run_job(job)

    assert time.monotonic() - started >= 1.0, "the job is ended after the grace, not before"
    assert job.status == JobStatus.FAILED and job.restart_count == 0, "a rank's own end is not restarted"
    said = [event.message for event in job.events.filter(kind="rank-ended").order_by("id")]
    assert len(said) == 2 and re.fullmatch(r"Rank 0 \(worker-0, node-a\) ended with exit code 1 at \d\d:\d\d:\d\d UTC; "
                                           r"the other ranks are still running", said[0]), said
    assert said[1] == "Rank 0 ended with exit code 1 and the job did not end within 1 s: ending its containers; the job fails"
    assert job.status_message.startswith("Rank 0 ended with exit code 1, and the other ranks waited for it")
    assert job.failure["kind"] != "node_lost", "the containers the run ended are not lost workers"
    assert nodes.teardowns[0] == [0, 1]


def test_a_rank_that_finished_as_0_while_the_others_run_is_neither_said_nor_failed_for_but_no_longer_watched(
        nodes, job, settings):
    settings.RANK_EXIT_GRACE_SECONDS = 0.1
    nodes.rank_ends = {1: RankEnd(1, 0, "finished with exit code 0", time.time(), finished=True)}
    job_run = JobRun(plan_allocated_job(job))

    asyncio.run(in_own_context(job_run.execute()))

    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert not job.events.filter(kind="rank-ended").exists()
    assert job_run.monitor is not None and job_run.monitor.ended == {1}, "the watchdog counts rank 1 silent no more"


def test_a_worker_whose_node_stopped_answering_is_not_waited_for_and_its_node_is_kept_out_of_service(nodes, job):
    nodes.exit_status = None
    nodes.lose = {1: "its node has not answered for 31 s (timed out)"}
    nodes.silent = frozenset({1})

    job = run_job(job)

    assert job.status == JobStatus.FAILED and job.failure["kind"] == "node_lost"
    assert nodes.teardowns == [[0]], "the silent node is not asked again: the job's end does not wait on SSH's timeout"
    assert Node.objects.get(name="node-b").state == Node.State.NOT_READY
    assert Node.objects.get(name="node-a").state == Node.State.READY
    assert not Node.objects.filter(allocated_to__isnull=False).exists()


def test_a_worker_lost_while_the_job_is_being_stopped_is_what_was_asked_for(nodes, job):
    nodes.exit_status = None
    nodes.lose = {1: "its container is gone"}
    nodes.output = []
    original = nodes.launch

    async def stop_then_launch(plan, sink, cursor=None, stopping=None, patience=None):
        await sync_to_async(lambda: TrainingJob.objects.get(pk=plan.job_id).terminate())()
        stopping.set()
        return await original(plan, sink, cursor, stopping)

    run.launch = stop_then_launch  # undone by the fixture's monkeypatch of the same name
    job = run_job(job)

    assert (job.status, job.status_message) == (JobStatus.TERMINATED, "Stopped by the user")
    assert nodes.teardowns == [[0, 1]]


def test_a_run_taken_up_again_skips_preparation_and_follows_from_the_stored_cursor(nodes, job):
    plan = plan_allocated_job(job)
    TrainingJob.objects.get(pk=job.pk).start()
    cursor = {"stdout": {"offset": 120, "reader": {}}, "stderr": {"offset": 7, "reader": {}}}
    TrainingJob.objects.filter(pk=job.pk).update(launch_cursor=cursor, run_owner="new:1:ab")

    asyncio.run(in_own_context(JobRun(plan, "new:1:ab").execute(resume=True)))

    job.refresh_from_db()
    assert nodes.prepared == [] and nodes.launches == 1 and nodes.cursor == cursor
    assert (job.status, job.exit_code) == (JobStatus.COMPLETED, 0)
    assert service_lines(job)[0] == (None, "Following the job again after the console process that ran it went away")


def test_a_run_whose_job_another_process_took_over_lets_go_without_ending_it(nodes, job, monkeypatch):
    monkeypatch.setattr(run, "HEARTBEAT_SECONDS", 0.05)
    plan = plan_allocated_job(job)
    TrainingJob.objects.filter(pk=job.pk).update(run_owner="old:1:ab")
    TrainingJob.objects.get(pk=job.pk).start()

    async def taken_over_meanwhile(plan, sink, cursor=None, stopping=None, patience=None):
        await sync_to_async(lambda: TrainingJob.objects.filter(pk=plan.job_id).update(run_owner="new:2:cd"))()
        await asyncio.sleep(5)
        raise AssertionError("the run should have let go")

    monkeypatch.setattr(run, "launch", taken_over_meanwhile)
    asyncio.run(in_own_context(JobRun(plan, "old:1:ab").execute(resume=True)))

    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.run_owner == "new:2:cd"
    assert nodes.teardowns == []
    assert Node.objects.filter(allocated_to=job).count() == 2


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
    assert [kind for kind in job.events.values_list("kind", flat=True) if kind.startswith("state:")] == [
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


def test_a_stop_that_lands_just_as_the_run_claims_its_job_ends_it_rather_than_leaving_it_terminating(
        nodes, job, monkeypatch):
    # The stop is committed right before the claim (on a busy database the claim waits for the stop's
    # transaction): the claim then finds the job Terminating, and no run, stop task or reaper round is needed.
    def owner_named_as_the_stop_lands():
        TrainingJob.objects.get(pk=job.pk).terminate()
        return "host:1:abcd"

    monkeypatch.setattr(run, "new_owner", owner_named_as_the_stop_lands)
    run.run_allocated_job(job.pk)

    job.refresh_from_db()
    assert (job.status, job.run_owner) == (JobStatus.TERMINATED, "")
    assert nodes.prepared == [] and nodes.launches == 0
    assert not Node.objects.filter(allocated_to__isnull=False).exists()


def test_a_second_delivery_of_a_run_leaves_the_job_to_the_run_that_owns_it(nodes, job):
    TrainingJob.objects.filter(pk=job.pk).update(run_owner="elsewhere:1:live", heartbeat_at=timezone.now())
    TrainingJob.objects.get(pk=job.pk).terminate()

    run.run_allocated_job(job.pk)

    job.refresh_from_db()
    assert (job.status, job.run_owner) == (JobStatus.TERMINATING, "elsewhere:1:live")
    assert Node.objects.filter(allocated_to=job).exists()


def test_the_heartbeat_survives_any_error_of_its_database_step(monkeypatch):
    import threading

    calls = []

    def broken(job_id, owner=""):
        calls.append(job_id)
        raise RuntimeError("not a database error")

    monkeypatch.setattr(run, "HEARTBEAT_SECONDS", 0.02)
    monkeypatch.setattr(run, "_touch_heartbeat", broken)

    still_beating = []

    async def beating():
        task = asyncio.create_task(JobRun(type("Plan", (), {"job_id": 1})()).beat())  # type: ignore[arg-type]
        await asyncio.sleep(0.2)
        still_beating.append(not task.done())
        task.cancel()

    thread = threading.Thread(target=lambda: asyncio.run(in_own_context(beating())))
    thread.start()
    thread.join()
    assert still_beating == [True], "the heartbeat died"
    assert len(calls) >= 3


def test_a_job_with_restarts_left_whose_worker_was_lost_is_queued_again_as_its_next_attempt(nodes, job):
    TrainingJob.objects.filter(pk=job.pk).update(max_restarts=2)
    nodes.exit_status = None
    nodes.lose = {1: "its container is gone"}

    job = run_job(job)

    assert (job.status, job.restart_count, job.attempt) == (JobStatus.PENDING, 1, 2)
    assert job.status_message.startswith("Restarting (attempt 2 of 3): A node was lost mid-job: node-b")
    assert job.attempt_log_starts == [job.log_line_count - 1], "attempt 2's lines follow the restart's own line"
    assert job.workers.count() == 0 and job.failure == {} and job.sealed_ssh_key == ""
    assert not Node.objects.filter(allocated_to__isnull=False).exists()
    assert list(job.events.filter(kind="restarted").values_list("message", flat=True)) == [
        "Attempt 1 failed (A node was lost mid-job: node-b); attempt 2 queued"]
    assert service_lines(job)[-1] == (None, "Auto restart: attempt 2 of 3 queued after: A node was lost mid-job: node-b")


def test_a_job_whose_rank_raised_is_not_restarted_however_many_restarts_it_has(nodes, job):
    TrainingJob.objects.filter(pk=job.pk).update(max_restarts=3)
    nodes.exit_status = 1
    nodes.output = [LogRecord(text="Traceback (most recent call last):", stream=LogStream.STDERR, rank=0, worker_index=0),
                    LogRecord(text="ValueError: bad learning rate", stream=LogStream.STDERR, rank=0, worker_index=0)]

    job = run_job(job)

    assert (job.status, job.exit_code, job.restart_count) == (JobStatus.FAILED, 1, 0)
    assert job.failure["kind"] == "exception"


def test_a_job_without_restarts_left_fails_as_it_would_without_auto_restart(nodes, job):
    TrainingJob.objects.filter(pk=job.pk).update(max_restarts=1, restart_count=1)
    nodes.exit_status = None
    nodes.lose = {1: "its container is gone"}

    job = run_job(job)

    assert (job.status, job.restart_count) == (JobStatus.FAILED, 1)
    assert job.failure["kind"] == "node_lost"


def test_each_workers_pre_check_and_a_lost_worker_are_on_the_jobs_events(nodes, job):
    nodes.exit_status = None
    nodes.lose = {1: "its container is gone"}

    job = run_job(job)

    events = list(job.events.values_list("kind", "message"))
    assert ("pre-check", "worker-0 container is up") in events and ("pre-check", "worker-1 container is up") in events
    assert ("worker-lost", "worker-1 (node-b) was lost: its container is gone") in events
    assert [kind for kind, _ in events if kind.startswith("state:")] == [
        "state:Creating", "state:Running", "state:Failed"]


def test_a_stop_during_a_long_preparation_cuts_it_short_and_the_job_ends_terminated(nodes, job, monkeypatch):
    monkeypatch.setattr(run, "STOP_POLL_SECONDS", 0.05)
    cut_short = []

    async def slow_image_load(plan, report, inputs=()):
        await sync_to_async(lambda: TrainingJob.objects.get(pk=plan.job_id).terminate())()
        try:
            await asyncio.sleep(30)  # a podman load of a large image
        except asyncio.CancelledError:
            cut_short.append(True)
            raise

    monkeypatch.setattr(run, "prepare_all", slow_image_load)
    started = time.monotonic()
    job = run_job(job)

    assert time.monotonic() - started < 5
    assert cut_short == [True]
    assert job.status == JobStatus.TERMINATED and nodes.launches == 0 and nodes.teardowns == [[0, 1]]
    assert not Node.objects.filter(allocated_to__isnull=False).exists()


def test_a_run_taken_up_after_its_process_saw_mpirun_end_ends_the_job_as_that_process_would_have(nodes, job):
    plan = plan_allocated_job(job)
    TrainingJob.objects.get(pk=job.pk).start()
    TrainingJob.objects.filter(pk=job.pk).update(
        run_owner="new:1:ab", launch_cursor={"ended": {"outcome": "exit", "exit_code": 0, "message": ""}})

    asyncio.run(in_own_context(JobRun(plan, "new:1:ab").execute(resume=True)))

    job.refresh_from_db()
    assert (job.status, job.exit_code) == (JobStatus.COMPLETED, 0), "not taken for lost, not restarted"
    assert nodes.launches == 0 and nodes.teardowns == [[0, 1]]


def test_how_the_run_ended_is_kept_before_its_teardown(nodes, job):
    seen = []
    original = nodes.teardown_all

    async def teardown_all(workers):
        seen.append(await sync_to_async(lambda: TrainingJob.objects.get(pk=job.pk).launch_cursor.get("ended"))())
        return await original(workers)

    nodes.exit_status = 3
    run.teardown_all = teardown_all  # undone with the fixture's monkeypatch of the same name
    run_job(job)
    assert seen == [{"outcome": "exit", "exit_code": 3, "message": ""}]


def test_a_job_stopped_while_it_runs_has_its_containers_ended_by_its_own_run_at_once(nodes, job, monkeypatch):
    stopped_at, ended_at = [], []

    async def launch_until_the_containers_go(plan, sink, cursor=None, stopping=None, patience=None):
        nodes.launches += 1
        await sync_to_async(lambda: TrainingJob.objects.get(pk=job.pk).terminate())()
        stopped_at.append(time.monotonic())
        deadline = time.monotonic() + 15
        while not nodes.teardowns and time.monotonic() < deadline:  # mpirun ends when its containers are ended
            await asyncio.sleep(0.05)
        ended_at.append(time.monotonic())
        return 143

    monkeypatch.setattr(run, "launch", launch_until_the_containers_go)
    job = run_job(job)

    # No stop task ran (none is queued here): the run saw the stop on its monitor's next look and acted,
    # well before the 5 s grace it once gave a stop task.
    assert nodes.teardowns, "the run never ended its containers"
    assert ended_at[0] - stopped_at[0] < MONITOR_INTERVAL_SECONDS + 3
    assert job.status == JobStatus.TERMINATED
    assert nodes.teardowns == [[0, 1]]  # the stop's: it left nothing, so the run's end does not look again
    assert (None, "Stopping: ending the containers on every node") in service_lines(job)
    assert not Node.objects.filter(allocated_to__isnull=False).exists()


def test_the_stop_task_leaves_a_job_its_live_run_follows_to_that_run_and_ends_one_nobody_follows(nodes, job):
    from datetime import timedelta

    from django.utils import timezone

    from jobs.runtime.run import new_owner, stop_running_job
    from jobs.secret_box import seal_secret

    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.TERMINATING, sealed_ssh_key=seal_secret("key"),
                                                 run_owner=new_owner(), heartbeat_at=timezone.now())
    stop_running_job(job.pk)
    assert nodes.teardowns == []

    TrainingJob.objects.filter(pk=job.pk).update(run_owner="elsewhere:1:gone", heartbeat_at=timezone.now()
                                                 - timedelta(minutes=10))
    stop_running_job(job.pk)
    assert nodes.teardowns == [[0, 1]]


def test_a_job_that_cannot_be_planned_fails_with_its_nodes_freed_in_the_one_ending(job, monkeypatch):
    from jobs.runtime import run as run_module

    def unplannable(job):
        raise ValueError("the engine version lost its image")

    monkeypatch.setattr(run_module, "plan_allocated_job", unplannable)
    run_module.run_allocated_job(job.pk)

    job.refresh_from_db()
    assert (job.status, job.status_message) == (JobStatus.FAILED, "cannot be launched: the engine version lost its image")
    assert not Node.objects.filter(allocated_to__isnull=False).exists()


def test_an_end_refused_again_and_again_frees_no_node_and_says_so(job, monkeypatch):
    from jobs.models import IllegalTransition, RunOutcome
    from jobs.runtime import ending

    monkeypatch.setattr(ending, "end_as", lambda *args: False)  # a state that keeps changing under the ending
    with pytest.raises(IllegalTransition, match="could not be recorded"):
        ending.settle(job.pk, RunOutcome.FAILED, None, "boom", [])

    assert Node.objects.filter(allocated_to=job).count() == 2, "no node freed while the job has no end"
