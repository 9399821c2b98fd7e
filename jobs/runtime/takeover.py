"""Taking up a job whose run lost its console process (a crash, a deploy, a reboot of the console's host).

A run beats (TrainingJob.heartbeat_at) and names its process (run_owner). A job whose run is silent
for RUN_STALE_SECONDS, or whose owner is a process of this host that no longer exists, is handed to
a live worker: a Running job is followed on from its stored offsets (its mpirun never depended on the
process that went away), a job caught in Creating or Terminating is ended. The hand-over is a
compare-and-set on the owner and heartbeat the reaper saw, so two workers never take up the same run.
"""

import asyncio
import logging
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from jobs.launch.plan import KeyPair, plan_job
from jobs.models import JobStatus, TrainingJob, workers_launch_values
from jobs.results.recording import launched_rank_workers
from jobs.runtime.run import JobRun, in_own_context, new_owner
from jobs.secret_box import open_secret

logger = logging.getLogger(__name__)


def claim(job_id: int, seen_owner: str, seen_heartbeat: datetime | None) -> str | None:
    """Become the run's owner if nobody changed it since the reaper looked; the new owner, or None."""
    owner = new_owner()
    taken = TrainingJob.objects.filter(pk=job_id, status=JobStatus.RUNNING, run_owner=seen_owner,
                                       heartbeat_at=seen_heartbeat).update(run_owner=owner, heartbeat_at=timezone.now())
    return owner if taken else None


def resumed_plan(job: TrainingJob):
    """The plan the job was launched with, from what was kept of it (its keys, its workers' containers)."""
    workers = workers_launch_values(job.workers.select_related("node").order_by("index"))
    return plan_job(job.launch_values(), workers, work_root=settings.NODE_WORK_ROOT, user=settings.JOB_USER,
                    preferred_uid=settings.JOB_USER_PREFERRED_UID,
                    client_key=KeyPair(private=open_secret(job.sealed_ssh_key), public=""),
                    host_key=KeyPair(private="", public=job.host_public_key),
                    rank_placement=launched_rank_workers(job))


def resume_run(job_id: int, seen_owner: str, seen_heartbeat: datetime | None) -> None:
    """Follow a Running job on from where its stored log ends, as its new owner."""
    owner = claim(job_id, seen_owner, seen_heartbeat)
    if owner is None:
        return
    job = TrainingJob.objects.select_related("spec", "engine_version", "code_dir").get(pk=job_id)
    logger.info("job %s: taking up its run (it was %s's)", job_id, seen_owner or "nobody's")
    asyncio.run(in_own_context(JobRun(resumed_plan(job), owner).execute(resume=True)))
