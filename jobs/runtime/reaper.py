"""The reaper: jobs whose run lost its console process are taken up again, or ended with their nodes freed.

Without it a lost worker would leave a job Running and its nodes allocated forever. A Running job is
not ended for it: its mpirun runs on in worker-0's container, and a live worker follows it on
(jobs.runtime.takeover). Creating and Terminating jobs are ended (containers removed, nodes freed).
"""

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from jobs.launch.plan import worker_plans
from jobs.logs.store import service_line
from jobs.models import JobEvent, JobStatus, RunOutcome, TrainingJob, workers_launch_values
from jobs.results.recording import launched_rank_workers
from jobs.runtime.ending import record_teardown, settle, unclean_workers
from jobs.runtime.ownership import owner_is_gone
from jobs.runtime.teardown import teardown_all

logger = logging.getLogger(__name__)

# A run that never started beating: its task was lost, or still waits behind busy workers. Only after
# this long is it taken for lost, so a queue of long jobs does not get the waiting ones reaped.
NEVER_STARTED_STALE_SECONDS = 15 * 60
# A stop of a job whose run never began: given this long for the run task to settle it itself.
UNSTARTED_STOP_GRACE_SECONDS = 5


@dataclass(frozen=True)
class Resumable:
    """A Running job to hand to a live worker, with the owner and heartbeat seen (the hand-over checks both)."""

    job_id: int
    owner: str
    heartbeat_at: datetime | None


@dataclass
class ReaperResult:
    ended: list[int]
    resumable: list[Resumable]


def live_runs():
    return TrainingJob.objects.filter(status__in=[JobStatus.CREATING, JobStatus.RUNNING, JobStatus.TERMINATING])


def orphaned_jobs() -> list[TrainingJob]:
    now = timezone.now()
    allocated_long_ago = JobEvent.objects.filter(
        job=OuterRef("pk"), kind=f"state:{JobStatus.CREATING}", at__lt=now - timedelta(seconds=NEVER_STARTED_STALE_SECONDS)
    )
    stop_asked_a_while_ago = JobEvent.objects.filter(
        job=OuterRef("pk"), kind=f"state:{JobStatus.TERMINATING}",
        at__lt=now - timedelta(seconds=UNSTARTED_STOP_GRACE_SECONDS)
    )
    stale = Q(heartbeat_at__lt=now - timedelta(seconds=settings.RUN_STALE_SECONDS))
    never_started = Q(heartbeat_at__isnull=True, status__in=[JobStatus.CREATING, JobStatus.TERMINATING]) & Exists(
        allocated_long_ago)
    # A stop that came before any run began: nothing was started anywhere, nothing needs waiting for.
    stopped_unstarted = Q(heartbeat_at__isnull=True, status=JobStatus.TERMINATING, sealed_ssh_key="") & Exists(
        stop_asked_a_while_ago)
    # A run whose process (on this host) is gone need not wait for its heartbeat to go stale.
    owner_gone = [pk for pk, owner in live_runs().exclude(run_owner="").values_list("pk", "run_owner")
                  if owner_is_gone(owner)]
    return list(live_runs().filter(stale | never_started | stopped_unstarted | Q(pk__in=owner_gone))
                .select_related("spec", "engine_version", "code_dir"))


def reap_orphaned_jobs() -> ReaperResult:
    result = ReaperResult(ended=[], resumable=[])
    for job in orphaned_jobs():
        if job.status == JobStatus.RUNNING and job.sealed_ssh_key:
            result.resumable.append(Resumable(job.pk, job.run_owner, job.heartbeat_at))
            continue
        try:
            reap(job)
        except Exception:  # one job that cannot be torn down must not keep the others' nodes
            logger.exception("job %s: reaping failed; it is settled with its nodes kept out of service", job.pk)
            settle(job.pk, RunOutcome.ABNORMAL, None, "the console lost the run of this job and could not end it",
                   [(worker.index, "the reaper could not reach it") for worker in job.workers.all()])
        result.ended.append(job.pk)
    return result


def reap(job: TrainingJob) -> None:
    if not job.sealed_ssh_key and job.status == JobStatus.TERMINATING:
        service_line(job.pk, "Stopped before its containers were started")
        settle(job.pk, RunOutcome.STOPPED, None, "stopped before launch", [])
        return
    service_line(job.pk, "The run of this job was lost (its worker stopped); ending its containers")
    workers = workers_launch_values(job.workers.select_related("node").order_by("index"))
    results = (asyncio.run(teardown_all(worker_plans(job.launch_values(), workers, settings.NODE_WORK_ROOT)))
               if job.sealed_ssh_key else [])
    if results:
        record_teardown(job.pk, results, launched_rank_workers(job))
    settle(job.pk, RunOutcome.ABNORMAL, None, "the console lost the run of this job (its worker stopped)",
           unclean_workers(results))
