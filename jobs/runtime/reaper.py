"""The reaper: jobs whose run stopped beating (its Celery worker died) get their containers ended and nodes freed.

Without it a lost worker would leave a job Running and its nodes allocated forever.
"""

import asyncio
import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from jobs.launch.plan import job_rank_workers, worker_plans
from jobs.logs.store import service_line
from jobs.models import JobEvent, JobStatus, RunOutcome, TrainingJob
from jobs.runtime.ending import record_teardown, settle, unclean_workers
from jobs.runtime.teardown import teardown_all

logger = logging.getLogger(__name__)

# A run silent for this long is gone (its worker died or restarted): the reaper takes the job over.
HEARTBEAT_STALE_SECONDS = 60
# A run that never started beating: its task was lost, or still waits behind busy workers. Only after
# this long is it taken for lost, so a queue of long jobs does not get the waiting ones reaped.
NEVER_STARTED_STALE_SECONDS = 15 * 60


def orphaned_jobs():
    now = timezone.now()
    allocated_long_ago = JobEvent.objects.filter(
        job=OuterRef("pk"), kind=f"state:{JobStatus.CREATING}", at__lt=now - timedelta(seconds=NEVER_STARTED_STALE_SECONDS)
    )
    return TrainingJob.objects.filter(
        Q(heartbeat_at__lt=now - timedelta(seconds=HEARTBEAT_STALE_SECONDS))
        | Q(heartbeat_at__isnull=True, status__in=[JobStatus.CREATING, JobStatus.TERMINATING]) & Exists(allocated_long_ago),
        status__in=[JobStatus.CREATING, JobStatus.RUNNING, JobStatus.TERMINATING],
    )


def reap_orphaned_jobs() -> list[int]:
    reaped = []
    for job in orphaned_jobs().select_related("spec", "engine_version", "code_dir"):
        try:
            reap(job)
        except Exception:  # noqa: BLE001 - one job that cannot be torn down must not keep the others' nodes
            logger.exception("job %s: reaping failed; it is settled with its nodes kept out of service", job.pk)
            settle(job.pk, RunOutcome.ABNORMAL, None, "the console lost the run of this job and could not end it",
                   [(worker.index, "the reaper could not reach it") for worker in job.workers.all()])
        reaped.append(job.pk)
    return reaped


def reap(job: TrainingJob) -> None:
    service_line(job.pk, "The run of this job was lost (its worker stopped); ending its containers")
    workers = list(job.workers.select_related("node").order_by("index"))
    results = asyncio.run(teardown_all(worker_plans(job, workers, settings.NODE_WORK_ROOT))) if job.sealed_ssh_key else []
    if results:
        record_teardown(job.pk, results, job_rank_workers(job))
    settle(job.pk, RunOutcome.ABNORMAL, None, "the console lost the run of this job (its worker stopped)",
           unclean_workers(results))
