"""A job's run once it has nodes: plan, prepare the containers, launch, collect, tear down, settle.

The Celery task calls run_allocated_job; each step lives in its own module. Beside the launch run
the monitor (metrics, watchdog, auto stop) and the worker watch (a lost node or container fails the
job); after it come the outputs, then the teardown, whose findings (each rank's end, what was left on
each node) go with the "why it failed" card.

One console process follows a run at a time: the one named in the job's run_owner, which keeps the
heartbeat. mpirun does not depend on that process (see jobs.runtime.launcher): when it goes away,
jobs.runtime.takeover gives the job to another, which runs `JobRun.execute(resume=True)`.

Each run gets its own asgiref ThreadSensitiveContext: without it every sync_to_async call of every
run in the worker process queues on asgiref's one process-wide thread, and one run's slow database
work delays the others' heartbeats.
"""

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable
from dataclasses import replace
from datetime import UTC, datetime
from typing import TypeVar, cast

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from jobs.launch.data_paths import object_url_of
from jobs.launch.plan import JobPlan, new_key_pair, plan_job, worker_plans
from jobs.logs.sink import LogSink
from jobs.logs.store import RunTakenOver, service_line
from jobs.models import (
    JobEvent,
    JobStatus,
    RunOutcome,
    StopReason,
    TrainingJob,
    Worker,
    WorkerState,
    workers_launch_values,
)
from jobs.results.evidence import REASON_FAILURE, REASON_WATCHDOG
from jobs.results.failure_card import DISK_LIMIT_REASON
from jobs.results.outputs import OutputsResult, container_path, outputs_root, record_outputs, train_url_of
from jobs.results.recording import record_failure
from jobs.results.watchdog import rank_exit_grace
from jobs.runtime.data_out import store_destination
from jobs.runtime.debug_hold import is_failure, settle_into_hold
from jobs.runtime.ending import launched_rank_workers, move, record_teardown, settle, unclean_workers
from jobs.runtime.evidence import EVIDENCE_POLL_SECONDS, evidence_kept, queue_evidence
from jobs.runtime.launcher import STOP_GRACE_SECONDS, LaunchCursor, launch
from jobs.runtime.liveness import RankEnd, WorkerWatch
from jobs.runtime.monitor import RunMonitor
from jobs.runtime.network_policy import ALLOWED_DESTINATIONS, allowed_destinations
from jobs.runtime.outputs import collect_outputs, list_shared_outputs
from jobs.runtime.ownership import followed_by_a_live_run
from jobs.runtime.preparation import prepare_all
from jobs.runtime.resources import ResourceRecorder
from jobs.runtime.run_data import RunData, in_database, job_event
from jobs.runtime.ssh import NodeError
from jobs.runtime.teardown import TeardownResult, teardown_all
from jobs.secret_box import seal_secret

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
# The steps of a worker's preparation that the job's events list, as the reference's events tab does.
WORKER_EVENTS: dict[str, str] = {WorkerState.UPLOADING: "code", WorkerState.READY: "pre-check", WorkerState.FAILED: "pre-check"}
# The ranks' ends (and tracebacks) a run says on the job's page, at most.
MAX_RANK_ENDS_SAID = 20
# How often the preparation looks whether the job was stopped meanwhile.
STOP_POLL_SECONDS = 1.0

T = TypeVar("T")


def record_plan(job: TrainingJob, plan: JobPlan) -> None:
    """Keep what is about to run on the job: the command as launched, its files, the job's keys."""
    job.command_template, job.command = plan.command_template, plan.command
    job.hostfile, job.tune_file = plan.hostfile, plan.tune_file
    job.sealed_ssh_key = seal_secret(plan.client_private_key)
    job.host_public_key = plan.host_public_key
    job.save(update_fields=["command_template", "command", "hostfile", "tune_file", "sealed_ssh_key", "host_public_key"])
    for worker in plan.workers:
        Worker.objects.filter(job=job, index=worker.index).update(container_name=worker.container_name)


def plan_allocated_job(job: TrainingJob) -> JobPlan:
    workers = workers_launch_values(job.workers.select_related("node").order_by("index"))
    plan = plan_job(job.launch_values(), workers, work_root=settings.NODE_WORK_ROOT, user=settings.JOB_USER,
                    preferred_uid=settings.JOB_USER_PREFERRED_UID, client_key=new_key_pair(), host_key=new_key_pair())
    record_plan(job, plan)
    return plan


def _set_worker(job_id: int, index: int, state: str, message: str) -> None:
    Worker.objects.filter(job_id=job_id, index=index).update(state=state, message=message)
    if state in WORKER_EVENTS:
        JobEvent.objects.create(job_id=job_id, kind=WORKER_EVENTS[state], message=message)


def _touch_heartbeat(job_id: int, owner: str = "") -> bool:
    """Beat for the run; False once another process has taken the run over."""
    jobs = TrainingJob.objects.filter(pk=job_id)
    if owner:
        jobs = jobs.filter(run_owner=owner)
    return jobs.update(heartbeat_at=timezone.now()) > 0


def _record_ending(job_id: int, outcome: str, exit_code: int | None, message: str) -> None:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().only("launch_cursor").get(pk=job_id)
        cursor = dict(job.launch_cursor or {})
        cursor["ended"] = {"outcome": outcome, "exit_code": exit_code, "message": message}
        TrainingJob.objects.filter(pk=job_id).update(launch_cursor=cursor)


def _launch_cursor(job_id: int) -> LaunchCursor:
    return cast(LaunchCursor, TrainingJob.objects.values_list("launch_cursor", flat=True).get(pk=job_id) or {})


def _close_connection() -> None:
    # Looked up in the thread that runs it: each thread has its own database connection.
    connection.close()


def _rank_exit_grace(job_id: int) -> float | None:
    return rank_exit_grace(TrainingJob.objects.values_list("rank_exit_grace_seconds", flat=True).get(pk=job_id))


def _status(job_id: int) -> str:
    return TrainingJob.objects.values_list("status", flat=True).get(pk=job_id)


def _has_object_outputs(job_id: int) -> bool:
    return bool(object_url_of(TrainingJob.objects.get(pk=job_id).parameter_pairs(), "train_url"))


def outputs_request(job_id: int, working_dir: str) -> tuple[str, str | None, int, bool] | None:
    """(train_url, its path in the container, the size limit the job was created with, whether the job ran to its
    end), or None without one."""
    job = TrainingJob.objects.only("parameters", "status", "outputs_max_bytes").get(pk=job_id)
    train_url = train_url_of(job.parameters)
    if not train_url:
        return None
    return train_url, container_path(train_url, working_dir), job.outputs_limit(), job.status == JobStatus.RUNNING


class JobRun(RunData):
    """The async part of a job's run. Database work goes through sync_to_async, in the job's order."""

    def __init__(self, plan: JobPlan, owner: str = ""):
        super().__init__()
        self.plan = plan
        self.job_id = plan.job_id
        self.owner = owner
        # Workers whose preparation failed keep saying so after the teardown.
        self.failed_workers: set[int] = set()
        # Set once the job stops running (a stop, a lost worker): the follow of mpirun winds up.
        self.stopping = asyncio.Event()
        # Workers lost mid-run (worker index -> what was seen), found by the worker watch.
        self.lost: dict[int, str] = {}
        # Another process took the run over (this one was thought gone): it must not end the job.
        self.disowned = False
        self.main: asyncio.Task | None = None
        self.losing: asyncio.Task | None = None
        # The containers ended mid-run (a stop, a console stop, lost workers): once, whoever asks first.
        self.ending_containers: asyncio.Task[list[TeardownResult]] | None = None
        # Whether mpirun was started for this attempt (by this process or the one before it): a job that failed
        # before has no rank whose end its failure card could tell.
        self.ranks_started = False
        # The workers whose node stopped answering mid-run: no teardown waits on them.
        self.unreachable: frozenset[int] = frozenset()
        # A stop the console carries out (a user's, auto stop, the watchdog): the notice, the last upload and the
        # containers' end, once, whoever asks first.
        self.ending_after_notice: asyncio.Task[None] | None = None
        # Ranks that ended on their own, not as 0, while the others went on (a rank that raised while the others
        # wait in a collective: mpi4py finalizes rather than aborts), and the wait before the job is failed.
        self.ended_ranks: dict[int, RankEnd] = {}
        self.failing_for_rank_end: asyncio.Task[None] | None = None
        self.rank_ends_said = 0
        self.monitor: RunMonitor | None = None
        # The run itself ended the containers for such a rank (why, in words): their going is not a lost worker.
        self.ended_for_rank_end = ""

    async def say(self, text: str, worker_index: int | None = None) -> None:
        await in_database(service_line, self.job_id, text, worker_index)

    async def report_worker(self, index: int, state: str, message: str) -> None:
        if state == WorkerState.FAILED:
            self.failed_workers.add(index)
        await in_database(_set_worker, self.job_id, index, state, message)
        await self.say(message, index)

    async def beat(self) -> None:
        """Touch the job's heartbeat while the run lives; a database that is briefly away must not end it."""
        while True:
            try:
                if not await in_database(_touch_heartbeat, self.job_id, self.owner):
                    logger.warning("job %s: its run was taken over by another process; this one lets go", self.job_id)
                    self.disowned = True
                    if self.main is not None:
                        self.main.cancel()
                    return
            except Exception as error:  # noqa: BLE001 - a database error or any other: the beat goes on
                # Left dead, the heartbeat would go stale and the reaper would end a healthy job.
                logger.warning("job %s: heartbeat failed (%s); trying again in %s s", self.job_id, error,
                               HEARTBEAT_SECONDS)
                await in_database(close_old_connections)
            await asyncio.sleep(HEARTBEAT_SECONDS)

    async def execute(self, resume: bool = False) -> None:  # noqa: C901 - the run's stages and each way one of them ends the run, in one place
        """The whole run; `resume`: the job is Running and its mpirun was started by a process now gone."""
        self.main = asyncio.current_task()
        outcome: str = RunOutcome.ABNORMAL
        exit_code, message = None, "the run ended unexpectedly"
        launched = self.ranks_started = resume
        heartbeat = asyncio.create_task(self.beat())
        try:
            cursor = await in_database(_launch_cursor, self.job_id) if resume else {}
            if resume and "ended" in cursor:
                # The process that went away had seen the run end and was ending the job: finish its work.
                ended = cursor["ended"]
                outcome, exit_code, message = ended["outcome"], ended["exit_code"], ended["message"]
                launched = False
                await self.say("Ending the job, as the console process that saw its run end was doing")
            elif resume:
                await self.say("Following the job again after the console process that ran it went away")
                await in_database(job_event, self.job_id, "resumed",
                                  "Taken up by another console process; the run went on meanwhile")
                exit_code = await self.launch_watched(cursor)
                outcome, message = self.outcome_of(exit_code)
            else:
                await self.say(f"Preparing {len(self.plan.workers)} worker(s)")
                await self.prepare_unless_stopped()
                if await in_database(_status, self.job_id) != JobStatus.CREATING or \
                        not await in_database(move, self.job_id, TrainingJob.start):
                    outcome, message = RunOutcome.STOPPED, "stopped before launch"
                    await self.say("Stopped before the launch: ending the containers")
                else:
                    await self.say("Launching: " + " ".join(self.plan.argv[:1]) + " on worker-0")
                    launched = self.ranks_started = True
                    exit_code = await self.launch_watched()
                    outcome, message = self.outcome_of(exit_code)
            if launched:
                await self.say(message or f"Training end with return code: {exit_code}")
                await self.collect_outputs()
        except asyncio.CancelledError:
            if not self.disowned:
                raise
        except RunTakenOver as error:
            logger.warning("job %s: %s; this process lets go of it", self.job_id, error)
            self.disowned = True
        except NodeError as error:
            outcome, message = RunOutcome.FAILED, str(error)
            await self.say(message)
        except Exception as error:  # whatever broke, the nodes must still be freed
            logger.exception("job %s: run failed", self.job_id)
            # In words, not a repr: this message is the job's state message, shown to its owner.
            outcome, message = RunOutcome.ABNORMAL, f"internal error ({type(error).__name__}): {error}"
            await self.say(message)
        finally:
            if self.disowned:
                heartbeat.cancel()
            else:
                await self.end(outcome, exit_code, message, launched, heartbeat)

    async def prepare_unless_stopped(self) -> None:
        """Prepare every worker; a stop meanwhile cuts it short (an image load or a pull can take minutes)."""
        # Read in the run's own thread; the preparation's task takes the value with its context.
        allowed = await in_database(allowed_destinations)
        # Worker-0 uploads train_url itself, as the job's user: the store is a destination the job may reach.
        await self.find_output_store()
        if self.output_sync is not None:
            allowed += store_destination(self.output_sync.where.endpoint_url)
        ALLOWED_DESTINATIONS.set(allowed)
        preparing = asyncio.create_task(prepare_all(self.plan, self.report_worker, inputs=await self.stagings()))
        while True:
            done, _ = await asyncio.wait([preparing], timeout=STOP_POLL_SECONDS)
            if done:
                preparing.result()
                return
            if await in_database(_status, self.job_id) != JobStatus.CREATING:
                preparing.cancel()
                await asyncio.gather(preparing, return_exceptions=True)
                return

    def outcome_of(self, exit_code: int | None) -> tuple[str, str]:
        """The run's outcome once mpirun is over: a lost worker fails the job whatever mpirun said, but a 0."""
        if self.ended_for_rank_end and exit_code != 0:
            return RunOutcome.FAILED, self.ended_for_rank_end[0].upper() + self.ended_for_rank_end[1:]
        if self.lost and exit_code != 0:
            index = min(self.lost)
            node = self.plan.node_names().get(index, "")
            reason = self.lost[index]
            if reason.startswith(DISK_LIMIT_REASON):  # ended by the worker watch, not lost
                return RunOutcome.FAILED, f"worker-{index} ({node}) was stopped: {reason}"
            return RunOutcome.FAILED, f"worker-{index} ({node}) was lost mid-run: {reason}"
        if exit_code is None:
            return RunOutcome.ABNORMAL, "mpirun on worker-0 ended without an exit status"
        return RunOutcome.EXIT, ""

    async def end(self, outcome: str, exit_code: int | None, message: str, launched: bool,
                  heartbeat: asyncio.Task[None]) -> None:
        """Tear down, explain, settle: the nodes are released even when the explaining fails."""
        if launched and is_failure(outcome, exit_code) and await in_database(_status, self.job_id) == JobStatus.RUNNING:
            # Taken while the containers are there: the live ranks' stacks go with them.
            await self.gather_evidence(REASON_FAILURE, wait=self.ending_containers is None)
        if launched and self.ending_containers is None and await self.hold_for_debugging(outcome, exit_code, message):
            heartbeat.cancel()
            return
        results: list[TeardownResult] = []
        try:
            await in_database(_record_ending, self.job_id, outcome, exit_code, message)
            results = await self.tear_down()
            # A node that cannot be reached after the launch began was lost mid-job.
            lost = {result.index: result.error for result in results if result.error} if launched else {}
            lost.update(self.lost)
            await in_database(record_failure, self.job_id, outcome, exit_code, message, lost,
                              self.plan.rank_workers if self.ranks_started else ())
        except Exception:  # the job must still end and its nodes be freed
            logger.exception("job %s: recording the end failed", self.job_id)
        finally:
            try:
                await in_database(settle, self.job_id, outcome, exit_code, message, unclean_workers(results))
            finally:
                # If settling failed too, the stale heartbeat hands the job to the reaper.
                heartbeat.cancel()

    async def gather_evidence(self, reason: str, wait: bool) -> None:
        """Ask the control queue for the job's evidence (jobs.runtime.evidence); with `wait`, give it up to
        EVIDENCE_WAIT_SECONDS before going on to end the containers. Nothing here holds the job's end up longer."""
        try:
            # The broker is asked off the event loop: one that is slow to answer must not hold the heartbeat up.
            if await in_database(evidence_kept, self.job_id, reason) or \
                    not await asyncio.to_thread(queue_evidence, self.job_id, reason) or not wait:
                return
            deadline = time.monotonic() + settings.EVIDENCE_WAIT_SECONDS + settings.SSH_CONNECT_TIMEOUT
            while time.monotonic() < deadline:
                await asyncio.sleep(EVIDENCE_POLL_SECONDS)
                if await in_database(evidence_kept, self.job_id, reason):
                    return
            await self.say(f"The {reason} evidence was not taken within {settings.EVIDENCE_WAIT_SECONDS} s; "
                           "ending the containers without waiting for it")
        except Exception:  # the job's end goes on without it
            logger.exception("job %s: asking for its evidence failed", self.job_id)

    async def hold_for_debugging(self, outcome: str, exit_code: int | None, message: str) -> bool:
        """A failure of a job that asked for a hold: the job ends, its containers and nodes stay (jobs.runtime.debug_hold);
        False when it is not held, and the run ends it as usual."""
        try:
            await in_database(_record_ending, self.job_id, outcome, exit_code, message)
            await in_database(record_failure, self.job_id, outcome, exit_code, message, dict(self.lost),
                              self.plan.rank_workers)
            return await in_database(settle_into_hold, self.job_id, outcome, exit_code, message)
        except Exception:  # the usual end follows: the nodes are freed whatever happened here
            logger.exception("job %s: holding it for debugging failed", self.job_id)
            return False

    async def launch_watched(self, cursor: LaunchCursor | None = None) -> int | None:
        """The launch, with the monitor and the worker watch beside it for as long as it runs."""
        monitor = self.monitor = RunMonitor(self.job_id, self.plan.rank_workers, self.plan.node_names(),
                                            self.stop_from_console, not_running=self.stopping, on_raised=self.rank_raised)
        watching = asyncio.create_task(monitor.run())
        recorder = ResourceRecorder(self.job_id)
        watch = WorkerWatch(self.plan.workers, self.lose_workers, on_usage=recorder.take,
                            on_rank_end=self.ranks_recorded_ended)
        # A sample at the launch and one at the end: a job shorter than the sampling interval is not one dot.
        workers = asyncio.create_task(recorder.follow(watch))
        stop = asyncio.create_task(self.carry_out_the_stop())
        syncing = asyncio.create_task(self.sync_outputs_while_running())
        checkpoints = asyncio.create_task(self.watch_checkpoints_while_running())
        try:
            sink = LogSink(self.job_id, owner=self.owner, on_stored=monitor.take_stored)
            # A stop waits out the job's notice before it ends mpirun: the follow waits as long for its end.
            exit_code = await launch(self.plan, sink, cursor, self.stopping,
                                     patience=STOP_GRACE_SECONDS + self.plan.checkpoint_grace_seconds)
            if exit_code != 0 and not self.lost and not self.ended_for_rank_end and \
                    await in_database(_status, self.job_id) == JobStatus.RUNNING:
                # mpirun may fail for a worker it lost before the watch's next look: one more look says so.
                workers.cancel()
                await asyncio.gather(workers, return_exceptions=True)
                self.lost = await watch.gone_workers()
            return exit_code
        finally:
            workers.cancel()
            stop.cancel()
            syncing.cancel()
            checkpoints.cancel()
            # mpirun is over (the ranks ended on the notice, or at the end of its grace): what is left of the
            # notice is moot, and the last upload is the end's (collect_outputs) whoever had begun it.
            noticing, failing = self.ending_after_notice, self.failing_for_rank_end
            for task in (noticing, failing):
                if task is not None and not task.done():
                    task.cancel()
            await asyncio.gather(workers, stop, syncing, checkpoints, *[task for task in (noticing, failing) if task],
                                 return_exceptions=True)
            if self.unreachable:
                watch.close()  # a silent node would only hold the end up for a probe's timeout
            else:
                await recorder.last_look(watch)
            if self.losing is not None:
                await asyncio.gather(self.losing, return_exceptions=True)
            await monitor.finish(watching)

    async def carry_out_the_stop(self) -> None:
        """A stop of the job this run follows is carried out here, as soon as the monitor sees it: the stop
        task leaves a job with a live run to it (stop_running_job), so a stop needs no free Celery thread,
        and one whose task was lost (the broker was away) needs nothing more."""
        await self.stopping.wait()
        if self.lost or await in_database(_status, self.job_id) != JobStatus.TERMINATING:
            return
        await self.end_after_notice("Stopping: ending the containers on every node")

    async def end_after_notice(self, message: str) -> None:
        """A stop the console carries out: the notice and its grace, the last upload, then every container ended."""
        if self.ending_after_notice is None:
            self.ending_after_notice = asyncio.create_task(self._end_after_notice(message))
        ending = self.ending_after_notice
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if ending.cancelled() and (current is None or current.cancelling() == 0):
                return  # called off because mpirun is over (launch_watched): the run's end does the rest
            raise

    async def _end_after_notice(self, message: str) -> None:
        await self.give_notice()
        await self.upload_outputs_before_the_end()
        await self.say(message)
        await self.end_containers()

    async def end_containers(self, unreachable: frozenset[int] = frozenset()) -> None:
        """End every worker's container now (mpirun then ends and the follow returns); once per run."""
        if self.ending_containers is None:
            self.ending_containers = asyncio.create_task(self._end_containers(unreachable))
        await asyncio.shield(self.ending_containers)

    async def _end_containers(self, unreachable: frozenset[int]) -> list[TeardownResult]:
        # A node the watch found silent is not asked again (that would add SSH's timeout to the job's end):
        # it is kept out of service, and cleaned by the node check once it answers.
        results = await teardown_all([worker for worker in self.plan.workers if worker.index not in unreachable])
        results += [TeardownResult(worker.index, None, f"{worker.node.label}: its node did not answer")
                    for worker in self.plan.workers if worker.index in unreachable]
        await in_database(record_teardown, self.job_id, results, self.plan.rank_workers)
        return results

    async def lose_workers(self, lost: dict[int, str], unreachable: frozenset[int]) -> None:
        # Its own task: ending the other containers must not be cut short when the launch returns.
        self.losing = asyncio.create_task(self.end_lost_run(lost, unreachable))

    async def end_lost_run(self, lost: dict[int, str], unreachable: frozenset[int]) -> None:
        """Workers gone mid-run fail the job: the others are ended now, not when Open MPI's timeout runs out."""
        if self.ended_for_rank_end or await in_database(_status, self.job_id) != JobStatus.RUNNING:
            return  # being stopped (or ended by the run): a container that goes is what was asked for
        self.lost = lost
        self.unreachable = unreachable
        for index, why in sorted(lost.items()):
            await in_database(job_event, self.job_id, "worker-lost",
                              f"worker-{index} ({self.plan.node_names().get(index, '')}) was lost: {why}")
            await self.say(f"worker-{index} ({self.plan.node_names().get(index, '')}) was lost: {why}; "
                           "ending the job's other containers", index)
        self.stopping.set()
        await self.end_containers(unreachable)

    async def ranks_recorded_ended(self, ended: dict[int, RankEnd]) -> None:
        """Ranks whose agent recorded their end (the worker watch): none of them is silent any more, whatever the
        watchdog's clock says; those that did not end as 0 may fail the job (rank_ended)."""
        if self.monitor is not None:
            self.monitor.take_ended(rank for rank in ended if 0 <= rank < self.plan.rank_count)
        failed = {rank: end for rank, end in ended.items() if not end.finished}
        if failed:
            await self.rank_ended(failed)

    async def rank_ended(self, ended: dict[int, RankEnd]) -> None:
        """Ranks found ended, not as 0 (the worker watch), or raising (the monitor), while the job runs: said once
        each; if the job does not end within its grace (the job's choice, else RANK_EXIT_GRACE_SECONDS; it may be
        0, or never), the run ends its containers and the job fails with that rank's card. Only the plan's ranks
        count, and a time ahead of now is taken as now (the records are the job's own)."""
        if self.stopping.is_set():
            return
        now = time.time()
        new = [replace(end, at=min(end.at, now)) for rank, end in sorted(ended.items())
               if 0 <= rank < self.plan.rank_count and (rank not in self.ended_ranks or self.raising(rank))
               and not (end.how.startswith("raised") and rank in self.ended_ranks)]
        for end in new:
            self.ended_ranks[end.rank] = end
            self.rank_ends_said += 1
            if self.rank_ends_said > MAX_RANK_ENDS_SAID:
                continue  # a program that raises and catches in a loop: the first few are on the page
            node = self.plan.node_names().get(end.worker, "")
            when = datetime.fromtimestamp(end.at, UTC).strftime("%H:%M:%S")
            words = f"Rank {end.rank} (worker-{end.worker}, {node}) {end.how} at {when} UTC; the other ranks are still running"
            await in_database(job_event, self.job_id, "rank-ended", words)
            await self.say(words, end.worker)
        if not new or self.failing_for_rank_end is not None:
            return
        grace = await in_database(_rank_exit_grace, self.job_id)
        if grace is not None and self.failing_for_rank_end is None:
            self.failing_for_rank_end = asyncio.create_task(self.fail_after_rank_end(grace))

    def raising(self, rank: int) -> bool:
        """Whether what is known of the rank's end is only a traceback in its log (its agent's record says more)."""
        known = self.ended_ranks.get(rank)
        return known is not None and known.how.startswith("raised")

    async def rank_raised(self, rank: int, text: str, at: datetime) -> None:
        """A rank's stderr ended a Python traceback (the monitor): taken as the rank's end while no rank prints
        anything more (mpi4py finalizes on an exception instead of aborting, so the others wait for it for ever)."""
        await self.rank_ended({rank: RankEnd(rank, self.plan.worker_of_rank(rank), f"raised {text[:200]}", at.timestamp())})

    def deadline_of(self, end: RankEnd, grace: float) -> float | None:
        """When the job fails for this rank's end; None when it no longer counts. A rank that raised counts while
        the job has printed nothing since (another rank's progress means it caught it, or the job goes on)."""
        if not end.how.startswith("raised"):
            return end.at + grace
        if self.monitor is None or not self.monitor.still_raised(end.rank):
            return None
        return max(end.at, self.monitor.last_line_at().timestamp()) + grace

    async def fail_after_rank_end(self, grace: float) -> None:
        while True:
            deadlines = {rank: deadline for rank, end in self.ended_ranks.items()
                         if (deadline := self.deadline_of(end, grace)) is not None}
            for rank in [rank for rank in self.ended_ranks if rank not in deadlines]:
                del self.ended_ranks[rank]  # a rank that raised and went on: said again if it raises again
            if not deadlines:
                self.failing_for_rank_end = None
                return
            wait = min(deadlines.values()) - time.time()
            if wait <= 0:
                break
            await asyncio.sleep(min(wait, 5.0))  # looked at again: a line printed meanwhile moves the deadline
        if self.stopping.is_set() or await in_database(_status, self.job_id) != JobStatus.RUNNING:
            return
        first = self.ended_ranks[min(deadlines, key=lambda rank: (self.ended_ranks[rank].at, rank))]
        words = f"Rank {first.rank} {first.how} and the job did not end within {grace:.0f} s: ending its containers; the job fails"
        await in_database(job_event, self.job_id, "rank-ended", words)
        await self.say(words)
        self.ended_for_rank_end = (f"rank {first.rank} {first.how}, and the other ranks waited for it: the job was "
                                   f"ended {grace:.0f} s later")
        self.stopping.set()
        await self.end_containers()

    async def stop_from_console(self, reason: str, message: str) -> None:
        """Auto stop and the watchdog stop a job as a user's stop does: every container ended on every node."""
        if not await in_database(move, self.job_id, lambda job: job.begin_console_stop(reason, message)):
            return
        if reason == StopReason.WATCHDOG:
            # The hung ranks' stacks, before the notice and the stop change what they are doing.
            await self.gather_evidence(REASON_WATCHDOG, wait=True)
        await self.end_after_notice(f"{message}; ending the containers on every node")

    async def collect_outputs(self) -> None:
        if self.output_sync is not None or await in_database(_has_object_outputs, self.job_id):
            await self.upload_outputs_before_the_end()
            return
        request = await in_database(outputs_request, self.job_id, self.plan.working_dir)
        if request is None:
            return
        train_url, remote_dir, limit, ran_to_end = request
        on_shared = remote_dir is not None and any(remote_dir == folder or remote_dir.startswith(folder + "/")
                                                   for folder in self.plan.writable_mounts)
        if on_shared and not ran_to_end:
            result = OutputsResult("on_shared", f"The job was stopped before it ended; what it wrote is in {remote_dir} "
                                   "on the shared file system (not listed).")
        elif on_shared:
            result = await list_shared_outputs(self.plan.container_target(self.plan.workers[0]), str(remote_dir))
        elif not ran_to_end:
            result = OutputsResult("not_collected", "The job was stopped before it ended; its outputs were not collected.")
        elif remote_dir is None:
            result = OutputsResult("not_a_path", f"{train_url} is not a path in the container; nothing was collected.")
        else:
            await self.say(f"Collecting the outputs in {remote_dir} from worker-0")
            target = self.plan.container_target(self.plan.workers[0])
            result = await collect_outputs(target, remote_dir, outputs_root(self.job_id), limit)
        await in_database(record_outputs, self.job_id, train_url, result)
        await in_database(job_event, self.job_id, "outputs", result.message)
        await self.say(result.message)

    async def tear_down(self) -> list[TeardownResult]:
        ended = self.ending_containers
        if ended is not None and ended.done() and not ended.cancelled() and ended.exception() is None:
            # Ended mid-run (a stop, lost workers): what that teardown found clean stands (a second one would
            # only cost every node two podman commands); the others are tried again, but for a node that did
            # not answer the watch, which would only add SSH's timeout to the job's end.
            earlier = {result.index: result for result in ended.result()}
            again = [worker for worker in self.plan.workers
                     if not earlier[worker.index].clean and worker.index not in self.unreachable]
            if again:
                earlier.update({result.index: result for result in await teardown_all(again)})
                await in_database(record_teardown, self.job_id, list(earlier.values()), self.plan.rank_workers)
            results = list(earlier.values())
        else:
            results = await teardown_all(self.plan.workers)
            await in_database(record_teardown, self.job_id, results, self.plan.rank_workers)
        for result in results:
            if result.clean and result.index in self.failed_workers:
                await self.say(f"worker-{result.index}: container removed after its failed preparation", result.index)
            elif result.clean:
                await self.report_worker(result.index, WorkerState.STOPPED,
                                         f"worker-{result.index}: container removed, no process left")
            else:
                await self.report_worker(result.index, WorkerState.UNCLEAN, f"worker-{result.index}: {result.problem}")
        return results


async def in_own_context(work: Awaitable[T]) -> T:
    """Await `work` with database calls on a thread of its own, closing that thread's connection after."""
    async with ThreadSensitiveContext():
        try:
            return await work
        finally:
            await sync_to_async(_close_connection)()


def run_allocated_job(job_id: int) -> None:
    owner = new_owner()
    # One run per job: a second delivery of the task, or a run already taken up elsewhere, finds it owned.
    claimed = TrainingJob.objects.filter(pk=job_id, status=JobStatus.CREATING, run_owner="").update(
        run_owner=owner, heartbeat_at=timezone.now())
    if not claimed:
        # Looked at after the claim, not before: a stop that lands between a look and the claim would
        # otherwise leave the job Terminating with no run to end it (until the reaper's next round).
        end_if_stopped_before_its_run(job_id)
        return
    job = TrainingJob.objects.select_related("spec", "engine_version", "code_dir").get(pk=job_id)
    try:
        plan = plan_allocated_job(job)
    except Exception as error:  # any error of the plan: the job is failed with it, never left allocated
        logger.exception("job %s: cannot be planned", job_id)
        reason = f"cannot be launched: {error}"
        service_line(job_id, f"The job {reason}")
        # The one ending: its nodes freed in the transaction that records its end.
        settle(job_id, RunOutcome.FAILED, None, reason, [])
        return
    asyncio.run(in_own_context(JobRun(plan, owner).execute()))


def end_if_stopped_before_its_run(job_id: int) -> None:
    """A job stopped after its nodes were given and before any run claimed it: nothing was started anywhere,
    so it ends here, its nodes freed. A job another run owns, or one already ended, is left as it is."""
    if TrainingJob.objects.filter(pk=job_id, status=JobStatus.TERMINATING, run_owner="", sealed_ssh_key="").exists():
        service_line(job_id, "Stopped before its containers were started")
        settle(job_id, RunOutcome.STOPPED, None, "stopped before launch", [])


def new_owner() -> str:
    """This process, as run_owner names it: host, pid, and a nonce (a pid is reused, the nonce is not)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def stop_running_job(job_id: int) -> None:
    """End the containers of a job asked to stop that no live run follows (its run ends them itself, see
    JobRun.carry_out_the_stop); the run, if one takes the job up, sees its launch session end and settles."""
    job = TrainingJob.objects.select_related("spec", "engine_version", "code_dir").get(pk=job_id)
    if job.status != JobStatus.TERMINATING or not job.sealed_ssh_key or followed_by_a_live_run(job):
        return
    service_line(job_id, "Stopping: ending the containers on every node")
    workers = workers_launch_values(job.workers.select_related("node").order_by("index"))
    results = asyncio.run(teardown_all(worker_plans(job.launch_values(), workers, settings.NODE_WORK_ROOT)))
    # The run's plan lives in another process: the placement is the one it launched with.
    record_teardown(job_id, results, launched_rank_workers(job))
