"""A job's life once it has nodes: plan, prepare the containers, launch, tear down, release.

The Celery task only calls run_allocated_job; each stage lives in its own module. Beside the launch
runs the monitor (metrics, watchdog, auto stop); after it come the outputs, then the teardown, whose
findings (each rank's end, what was left on each node) are kept with the "why it failed" card.
"""

import asyncio
import logging
from datetime import timedelta

import asyncssh
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from .allocation import release_nodes
from .command_builder import LaunchInputs, build_launch_command
from .launcher import LogSink, launch
from .log_store import service_line
from .models import IllegalTransition, JobEvent, JobStatus, LauncherDefaults, Node, TrainingJob, Worker
from .node_preparation import JobPlan, WorkerPlan, prepare_all
from .node_ssh import NodeError, SshTarget
from .outcome import record_failure, record_rank_records
from .outputs import OutputsResult, collect_outputs, container_path, outputs_root, record_outputs, train_url_of
from .platform_env import hosts_file_text, worker_environment
from .secret_box import seal_secret
from .run_monitor import RunMonitor
from .teardown import TeardownResult, all_rank_records, cleanup_report, teardown_all

logger = logging.getLogger(__name__)


def launch_inputs(job: TrainingJob, worker_hostnames: list[str], worker0_env: dict[str, str]) -> LaunchInputs:
    """What the command builder needs from a job; the form preview calls this too."""
    return LaunchInputs(
        processes_per_node=job.spec.processes_per_node,
        worker_hostnames=worker_hostnames,
        sshd_port=job.sshd_port or 0,
        python=job.engine_version.python,
        code_dir_name=job.code_dir.name,
        boot_file=job.boot_file,
        parameters=[(item["name"], item["value"]) for item in job.parameters],
        worker0_env=worker0_env,
        bind_args=job.bind_args,
        x_args=job.x_args,
        mca_args=job.mca_args,
        extra_args=job.extra_args,
        tune_prefixes=[prefix for prefix in job.tune_prefixes.split(",") if prefix],
    )


def _new_key_pair() -> tuple[str, str]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    return key.export_private_key("openssh").decode(), key.export_public_key("openssh").decode().strip()


def plan_job(job: TrainingJob) -> JobPlan:
    """Everything the job's run needs, computed once; the command, hostfile and tune file are kept on the job."""
    workers = list(job.workers.select_related("node").order_by("index"))
    addresses = [worker.address for worker in workers]
    environments = [
        worker_environment(
            job_dns=job.dns_name,
            worker_index=worker.index,
            worker_addresses=addresses,
            gpus_per_node=job.spec.gpu_count,
            engine_env=job.engine_version.default_env,
            user_env=job.env,
        )
        for worker in workers
    ]
    command = build_launch_command(launch_inputs(job, [worker.hostname for worker in workers], environments[0]))
    client_private, client_public = _new_key_pair()
    host_private, host_public = _new_key_pair()
    job.command_template, job.command = command.template, command.expanded
    job.hostfile, job.tune_file = command.hostfile, command.tune_file
    job.sealed_ssh_key = seal_secret(client_private)
    job.host_public_key = host_public
    job.save(update_fields=["command_template", "command", "hostfile", "tune_file", "sealed_ssh_key", "host_public_key"])
    return JobPlan(
        job_id=job.pk,
        job_dns=job.dns_name,
        user=settings.JOB_USER,
        preferred_uid=settings.JOB_USER_PREFERRED_UID,
        sshd_port=job.sshd_port,
        processes_per_node=job.spec.processes_per_node,
        code_dir_name=job.code_dir.name,
        code_dir_path=job.code_dir.path,
        client_private_key=client_private,
        client_public_key=client_public,
        host_private_key=host_private,
        host_public_key=host_public,
        hostfile=command.hostfile,
        tune_file=command.tune_file,
        hosts_file=hosts_file_text(job.dns_name, addresses),
        argv=command.argv,
        working_dir=command.working_dir,
        workers=worker_plans(job, workers, environments),
    )


def worker_plans(job: TrainingJob, workers: list[Worker], environments: list[dict[str, str]] | None = None) -> list[WorkerPlan]:
    work_root = settings.NODE_WORK_ROOT.rstrip("/")
    return [
        WorkerPlan(
            index=worker.index,
            node=node_target(worker.node),
            address=worker.address,
            hostname=worker.hostname,
            env=environments[worker.index] if environments else {},
            workdir=f"{work_root}/{job.dns_name}/worker-{worker.index}",
        )
        for worker in workers
        if worker.node
    ]


def node_target(node: Node) -> SshTarget:
    return SshTarget(
        label=node.name,
        address=node.address,
        port=node.ssh_port,
        username=node.ssh_user,
        private_key=node.private_key,
        host_key=node.host_key,
    )


def _set_worker(job_id: int, index: int, state: str, message: str) -> None:
    Worker.objects.filter(job_id=job_id, index=index).update(state=state, message=message)


def _set_state(job_id: int, method: str, *args, **fields) -> bool:
    job = TrainingJob.objects.get(pk=job_id)
    try:
        getattr(job, method)(*args, **fields)
    except IllegalTransition:
        return False
    return True


HEARTBEAT_SECONDS = 5
# A run silent for this long is gone (its worker died or restarted): the reaper takes the job over.
HEARTBEAT_STALE_SECONDS = 60
# A run that never started beating: its task was lost, or still waits behind busy workers. Only after
# this long is it taken for lost, so a queue of long jobs does not get the waiting ones reaped.
NEVER_STARTED_STALE_SECONDS = 15 * 60


def _touch_heartbeat(job_id: int) -> None:
    TrainingJob.objects.filter(pk=job_id).update(heartbeat_at=timezone.now())


def _status(job_id: int) -> str:
    return TrainingJob.objects.values_list("status", flat=True).get(pk=job_id)


def _settle(job_id: int, outcome: str, exit_code: int | None, message: str, teardown_problems: list[tuple[int, str]]) -> None:
    """Release the nodes (a node that could not be cleaned is kept out of service) and record the end."""
    with transaction.atomic():
        for problem_index, problem in teardown_problems:
            Node.objects.filter(workers__job_id=job_id, workers__index=problem_index).update(
                state=Node.State.NOT_READY, state_message=f"after job {job_id}: {problem}"
            )
        release_nodes(job_id)
    status = _status(job_id)
    if status == JobStatus.TERMINATING:
        _set_state(job_id, "transition", JobStatus.TERMINATED, _stopped_message(job_id))
    elif outcome == "exit" and exit_code is not None:
        _set_state(job_id, "finish", exit_code)
    elif outcome == "failed":
        _set_state(job_id, "fail", message)
    else:
        _set_state(job_id, "transition", JobStatus.ABNORMAL, message)


def _stopped_message(job_id: int) -> str:
    job = TrainingJob.objects.only("stop_reason", "status_message").get(pk=job_id)
    # A stop by the console says why it stopped the job when it asks; a user's stop is just that.
    return job.status_message if job.stop_reason else "Stopped by the user"


def _begin_console_stop(job_id: int, reason: str, message: str) -> bool:
    return _set_state(job_id, "transition", JobStatus.TERMINATING, message, stop_reason=reason)


def _record_teardown(job_id: int, results: list[TeardownResult]) -> None:
    """Keep what a teardown found: each rank's end (from its agent's record) and what was left on each node."""
    record_rank_records(job_id, all_rank_records(results))
    names = dict(Worker.objects.filter(job_id=job_id).values_list("index", "node_name"))
    TrainingJob.objects.filter(pk=job_id).update(cleanup_report=cleanup_report(results, names))


def _outputs_request(job_id: int, working_dir: str) -> tuple[str, str | None, int, bool] | None:
    """(train_url, its path in the container, the size limit, whether the job ran to its end), or None without one."""
    job = TrainingJob.objects.only("parameters", "status").get(pk=job_id)
    train_url = train_url_of(job.parameters)
    if not train_url:
        return None
    limit = LauncherDefaults.current().outputs_max_bytes
    return train_url, container_path(train_url, working_dir), limit, job.status == JobStatus.RUNNING


class JobRun:
    """The async part of a job's run. Database work goes through sync_to_async, in the job's order."""

    def __init__(self, plan: JobPlan):
        self.plan = plan
        self.job_id = plan.job_id

    async def say(self, text: str, worker_index: int | None = None) -> None:
        await sync_to_async(service_line)(self.job_id, text, worker_index)

    async def report_worker(self, index: int, state: str, message: str) -> None:
        await sync_to_async(_set_worker)(self.job_id, index, state, message)
        await self.say(message, index)

    async def beat(self) -> None:
        while True:
            await sync_to_async(_touch_heartbeat)(self.job_id)
            await asyncio.sleep(HEARTBEAT_SECONDS)

    async def execute(self) -> None:
        outcome, exit_code, message = "abnormal", None, "the run ended unexpectedly"
        heartbeat = asyncio.create_task(self.beat())
        try:
            await self.say(f"Preparing {len(self.plan.workers)} worker(s)")
            await prepare_all(self.plan, self.report_worker)
            if await sync_to_async(_status)(self.job_id) != JobStatus.CREATING:
                outcome, message = "stopped", "stopped before launch"
            elif not await sync_to_async(_set_state)(self.job_id, "start"):
                outcome, message = "stopped", "stopped before launch"
            else:
                await self.say("Launching: " + " ".join(self.plan.argv[:1]) + " on worker-0")
                exit_code = await self.launch_watched()
                outcome = "exit" if exit_code is not None else "abnormal"
                message = "" if exit_code is not None else "the launch session on worker-0 was cut"
                await self.say(f"Training end with return code: {exit_code}")
                await self.collect_outputs()
        except NodeError as error:
            outcome, message = "failed", str(error)
            await self.say(message)
        except Exception as error:  # noqa: BLE001 - whatever broke, the nodes must still be freed
            logger.exception("job %s: run failed", self.job_id)
            outcome, message = "abnormal", f"internal error: {error!r}"
            await self.say(message)
        finally:
            results = await self.tear_down()
            problems = [(result.index, _problem(result)) for result in results if not result.clean]
            # A node that cannot be reached after the launch began was lost mid-job.
            lost = {result.index: result.error for result in results if result.error} if outcome != "failed" else {}
            await sync_to_async(record_failure)(self.job_id, outcome, exit_code, message, lost)
            await sync_to_async(_settle)(self.job_id, outcome, exit_code, message, problems)
            heartbeat.cancel()

    async def launch_watched(self) -> int | None:
        """The launch, with the monitor beside it for as long as it runs."""
        per_node = self.plan.processes_per_node
        monitor = RunMonitor(
            self.job_id, per_node * len(self.plan.workers), per_node,
            {worker.index: worker.node.label for worker in self.plan.workers}, self.stop_from_console,
        )
        watching = asyncio.create_task(monitor.run())
        try:
            return await launch(self.plan, LogSink(self.job_id))
        finally:
            await monitor.finish(watching)

    async def stop_from_console(self, reason: str, message: str) -> None:
        """Auto stop and the watchdog stop a job as a user's stop does: every container ended on every node."""
        if not await sync_to_async(_begin_console_stop)(self.job_id, reason, message):
            return
        await self.say(f"{message}; ending the containers on every node")
        await sync_to_async(_record_teardown)(self.job_id, await teardown_all(self.plan.workers))

    async def collect_outputs(self) -> None:
        request = await sync_to_async(_outputs_request)(self.job_id, self.plan.working_dir)
        if request is None:
            return
        train_url, remote_dir, limit, ran_to_end = request
        if not ran_to_end:
            result = OutputsResult("not_collected", "The job was stopped before it ended; its outputs were not collected.")
        elif remote_dir is None:
            result = OutputsResult("not_a_path", f"{train_url} is not a path in the container; nothing was collected.")
        else:
            await self.say(f"Collecting the outputs in {remote_dir} from worker-0")
            target = self.plan.container_target(self.plan.workers[0])
            result = await collect_outputs(target, remote_dir, outputs_root(self.job_id), limit)
        await sync_to_async(record_outputs)(self.job_id, train_url, result)
        await self.say(result.message)

    async def tear_down(self) -> list[TeardownResult]:
        results = await teardown_all(self.plan.workers)
        for result in results:
            if result.clean:
                await self.report_worker(result.index, "Stopped", f"worker-{result.index}: container removed, no process left")
            else:
                await self.report_worker(result.index, "Unclean", f"worker-{result.index}: {_problem(result)}")
        await sync_to_async(_record_teardown)(self.job_id, results)
        return results


def _problem(result: TeardownResult) -> str:
    return result.error or f"{result.processes_left} process(es) could not be ended"


def run_allocated_job(job_id: int) -> None:
    job = TrainingJob.objects.select_related("spec", "engine_version", "code_dir").get(pk=job_id)
    if job.status != JobStatus.CREATING:
        return
    try:
        plan = plan_job(job)
    except Exception as error:  # noqa: BLE001
        logger.exception("job %s: cannot be planned", job_id)
        service_line(job_id, f"The job cannot be launched: {error}")
        release_nodes(job_id)
        _set_state(job_id, "fail", f"cannot be launched: {error}")
        return
    asyncio.run(JobRun(plan).execute())


def stop_running_job(job_id: int) -> None:
    """End the containers of a job asked to stop; the run sees its launch session end and settles."""
    job = TrainingJob.objects.select_related("spec", "engine_version", "code_dir").get(pk=job_id)
    if job.status != JobStatus.TERMINATING or not job.sealed_ssh_key:
        return
    service_line(job_id, "Stopping: ending the containers on every node")
    workers = list(job.workers.select_related("node").order_by("index"))
    _record_teardown(job_id, asyncio.run(teardown_all(worker_plans(job, workers))))


def reap_orphaned_jobs() -> list[int]:
    """Jobs whose run stopped beating (a worker killed mid-job): end their containers, free their nodes.

    Without this a lost worker would leave a job Running and its nodes allocated forever.
    """
    now = timezone.now()
    allocated_long_ago = JobEvent.objects.filter(
        job=OuterRef("pk"), kind=f"state:{JobStatus.CREATING}", at__lt=now - timedelta(seconds=NEVER_STARTED_STALE_SECONDS)
    )
    orphans = TrainingJob.objects.filter(
        Q(heartbeat_at__lt=now - timedelta(seconds=HEARTBEAT_STALE_SECONDS))
        | Q(heartbeat_at__isnull=True, status=JobStatus.CREATING) & Exists(allocated_long_ago),
        status__in=[JobStatus.CREATING, JobStatus.RUNNING, JobStatus.TERMINATING],
    )
    reaped = []
    for job in orphans.select_related("spec", "engine_version", "code_dir"):
        service_line(job.pk, "The run of this job was lost (its worker stopped); ending its containers")
        workers = list(job.workers.select_related("node").order_by("index"))
        results = asyncio.run(teardown_all(worker_plans(job, workers))) if job.sealed_ssh_key else []
        if results:
            _record_teardown(job.pk, results)
        problems = [(result.index, _problem(result)) for result in results if not result.clean]
        _settle(job.pk, "abnormal", None, "the console lost the run of this job (its worker stopped)", problems)
        reaped.append(job.pk)
    return reaped
