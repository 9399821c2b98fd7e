"""A job's evidence bundle, taken on the control queue (jobs.tasks.take_evidence) when the job fails or its
watchdog fires: each live rank's Python stacks (py-spy, in the engine images) over the console's SSH to each
node, with the stored last lines, the masked environment, the command and the node facts (jobs.results.evidence).
A node or a dump that fails is said in the bundle; the bundle is kept all the same."""

import asyncio
import shlex

import asyncssh
from celery import current_app
from django.conf import settings

from jobs.launch.plan import WorkerPlan, worker_plans
from jobs.models import EvidenceBundle, TrainingJob, workers_launch_values
from jobs.results.evidence import WorkerStacks, evidence_content, has_bundle, keep_bundle, parse_rank_stacks
from jobs.results.recording import launched_rank_workers
from jobs.runtime.containers import JOB_UID
from jobs.runtime.preparation import NODE_SCRIPTS
from jobs.runtime.ssh import NodeError, connect

STACKS_SCRIPT = (NODE_SCRIPTS / "rank-stacks.sh").read_text()
# The seconds the connection keeps beyond the script's own budget (SSH, podman exec, the output).
SCRIPT_SLACK_SECONDS = 8
# How often a run looks whether the evidence it asked for is kept yet.
EVIDENCE_POLL_SECONDS = 0.5


async def worker_stacks(worker: WorkerPlan, budget: float) -> WorkerStacks:
    """The live ranks' stacks in one worker's container, or why none could be taken."""
    stacks = WorkerStacks(worker=worker.index, node=worker.node.label, ranks=[], problem="")
    try:
        connection = await connect(worker.node)
        async with connection:
            # The script shares out its own budget among the dumps, so its output (partial stacks included)
            # comes back before the connection's timeout; it runs as the job's user, never the image's default.
            result = await connection.run(
                shlex.join(["podman", "exec", "-i", "--user", f"{JOB_UID}:{JOB_UID}", worker.container_name,
                            "sh", "-s", "--", str(max(int(budget) - SCRIPT_SLACK_SECONDS, 2))]),
                input=STACKS_SCRIPT, check=False, timeout=budget)
    except NodeError as error:
        stacks["problem"] = str(error)
        return stacks
    except (TimeoutError, OSError, asyncssh.Error) as error:
        stacks["problem"] = f"taking the stacks failed: {error or type(error).__name__}"
        return stacks
    output = str(result.stdout or "")
    if result.exit_status != 0 and "@@ " not in output:
        stacks["problem"] = f"podman exec said: {(str(result.stderr or '') or output).strip()[-500:]}"
        return stacks
    stacks["ranks"] = parse_rank_stacks(output)
    if not stacks["ranks"]:
        stacks["problem"] = "no live Python rank in the container"
    return stacks


async def all_stacks(workers: list[WorkerPlan], budget: float) -> list[WorkerStacks]:
    return list(await asyncio.gather(*(worker_stacks(worker, budget) for worker in workers)))


def take_bundle(job_id: int, reason: str) -> EvidenceBundle | None:
    """Take and keep the job's evidence for its current attempt; None if this attempt already has it."""
    job = TrainingJob.objects.select_related("spec", "engine_version", "code_dir").get(pk=job_id)
    if has_bundle(job_id, job.attempt, reason):
        return None
    workers = workers_launch_values(job.workers.select_related("node").order_by("index"))
    plans = [plan for plan in worker_plans(job.launch_values(), workers, settings.NODE_WORK_ROOT) if plan.container_name]
    if job.sealed_ssh_key and plans:
        stacks = asyncio.run(all_stacks(plans, float(settings.EVIDENCE_WAIT_SECONDS)))
    else:
        stacks = [WorkerStacks(worker=plan.index, node=plan.node.label, ranks=[], problem="its container was never started")
                  for plan in plans]
    return keep_bundle(job, evidence_content(job, reason, len(launched_rank_workers(job)), stacks))


def queue_evidence(job_id: int, reason: str) -> bool:
    """Ask the control queue for the job's evidence (jobs.tasks.take_evidence); False if the broker is away."""
    try:
        current_app.send_task("jobs.tasks.take_evidence", args=(job_id, reason), retry=False)
    except Exception:  # noqa: BLE001 - no evidence is no reason to hold up the job's end
        return False
    return True


def evidence_kept(job_id: int, reason: str) -> bool:
    attempt = TrainingJob.objects.get(pk=job_id).attempt
    return has_bundle(job_id, attempt, reason)
