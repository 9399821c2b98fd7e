"""A failed job kept for a look inside: its containers and nodes stay for the job's debug_hold_minutes, with the
job already ended (Failed) and held_until saying until when; then they are ended and freed as any end frees them.

A hold is ended by whoever sees it expired first: the reaper's periodic look (so a console that restarted
meanwhile still frees the nodes) or its owner's "release now", which only moves held_until to now.
"""

import asyncio
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.launch.plan import worker_plans
from jobs.logs.store import service_line
from jobs.models import JobEvent, JobStatus, RunOutcome, TrainingJob, Worker, WorkerState, workers_launch_values
from jobs.results.checkpoints import close_attempt
from jobs.results.recording import launched_rank_workers
from jobs.runtime.ending import end_as, record_teardown, release_after_teardown, restart_reason, unclean_workers
from jobs.runtime.liveness import WorkerWatch
from jobs.runtime.teardown import teardown_all

logger = logging.getLogger(__name__)


def is_failure(outcome: str, exit_code: int | None) -> bool:
    """Whether a run's outcome is a failure a hold may follow (a stop or a 0 exit is not)."""
    return outcome != RunOutcome.STOPPED and not (outcome == RunOutcome.EXIT and exit_code == 0)


def hold_ends_at(minutes: int, now: datetime, minute_seconds: int) -> datetime:
    """When a hold of `minutes` begun at `now` ends (a minute lasts settings.DEBUG_HOLD_MINUTE_SECONDS)."""
    return now + timedelta(seconds=minutes * minute_seconds)


def may_hold(job: TrainingJob, outcome: str, exit_code: int | None) -> bool:
    """A failure of a Running job that asked for a hold, will not be restarted, and whose nodes are the console's
    own (a Slurm pool's allocation is given back by Slurm's watch, not kept)."""
    return (job.debug_hold_minutes > 0 and job.status == JobStatus.RUNNING and job.slurm_job_id is None
            and is_failure(outcome, exit_code) and not restart_reason(job))


def settle_into_hold(job_id: int, outcome: str, exit_code: int | None, message: str) -> bool:
    """End the job as its run's outcome says while keeping its nodes and containers; False if it may not be held
    (a stop came meanwhile, a restart): the caller then ends it as usual."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if not may_hold(job, outcome, exit_code):
            return False
        until = hold_ends_at(job.debug_hold_minutes, timezone.now(), settings.DEBUG_HOLD_MINUTE_SECONDS)
        close_attempt(job_id, message or (f"exit status {exit_code}" if exit_code is not None else outcome))
        TrainingJob.objects.filter(pk=job_id).update(held_until=until)
        if not end_as(job_id, outcome, exit_code, message):
            transaction.set_rollback(True)
            return False
        JobEvent.objects.create(job_id=job_id, kind="debug-hold",
                                message=f"Containers and nodes held for debugging until {until:%H:%M:%S} UTC")
    service_line(job_id, f"The containers and nodes are held for debugging until {until:%H:%M:%S} UTC")
    return True


def expired_holds(now: datetime | None = None) -> list[int]:
    """Jobs whose hold is over and whose containers and nodes are still kept."""
    return list(TrainingJob.objects.filter(held_until__lte=now or timezone.now()).values_list("pk", flat=True))


def held_jobs(now: datetime | None = None) -> list[int]:
    """Jobs whose hold still lasts: their containers are watched for their disk, as a running job's are."""
    return list(TrainingJob.objects.filter(held_until__gt=now or timezone.now()).values_list("pk", flat=True))


def check_held_disk(job_id: int) -> str:
    """One look at a held job's workers: one past its spec's disk limit (its owner writes in a terminal), or on a
    node short of its reserve, ends the hold now, saying why; the caller then ends it. "" when none is."""
    job = (TrainingJob.objects.select_related("spec", "engine_version", "code_dir")
           .filter(pk=job_id, held_until__gt=timezone.now()).first())
    if job is None or not job.sealed_ssh_key:
        return ""
    plans = worker_plans(job.launch_values(), workers_launch_values(job.workers.select_related("node").order_by("index")),
                         settings.NODE_WORK_ROOT)
    over = next((probe for probe in asyncio.run(WorkerWatch(plans).look_once()) if probe.over_limit), None)
    if over is None:
        return ""
    message = f"The hold ended early: worker-{over.index} {over.over_limit}"
    now = timezone.now()
    if TrainingJob.objects.filter(pk=job_id, held_until__gt=now).update(held_until=now):
        JobEvent.objects.create(job_id=job_id, kind="debug-hold", message=message)
        service_line(job_id, message)
    return message


def end_hold(job_id: int) -> bool:
    """End the held job's containers on every node and free its nodes, as a run's end does; False if the job
    is not held, or its hold is not over yet."""
    job = (TrainingJob.objects.select_related("spec", "engine_version", "code_dir")
           .filter(pk=job_id, held_until__lte=timezone.now()).first())
    if job is None:
        return False
    service_line(job_id, "The hold for debugging is over: ending the containers on every node")
    workers = workers_launch_values(job.workers.select_related("node").order_by("index"))
    results = (asyncio.run(teardown_all(worker_plans(job.launch_values(), workers, settings.NODE_WORK_ROOT)))
               if job.sealed_ssh_key else [])
    if results:
        record_teardown(job_id, results, launched_rank_workers(job))
    with transaction.atomic():
        release_after_teardown(job_id, unclean_workers(results))
        # The workers' rows say what became of their containers, as a run's end says it.
        for result in results:
            state, words = ((WorkerState.STOPPED, "container removed, no process left") if result.clean
                            else (WorkerState.UNCLEAN, result.problem))
            Worker.objects.filter(job_id=job_id, index=result.index).update(
                state=state, message=f"worker-{result.index}: {words}")
        TrainingJob.objects.filter(pk=job_id).update(held_until=None)
        JobEvent.objects.create(job_id=job_id, kind="debug-hold", message="The hold ended; the nodes were freed")
    return True
