"""Celery tasks: thin entry points into the stages. The only module that calls into jobs.runtime; the stages
that ask for work queue these by name (jobs.submission.task_queue), runs on the "runs" queue and the rest on "control"
(console/settings.py)."""

import logging
from collections.abc import Iterable
from datetime import datetime
from functools import partial

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from console.database_busy import DATABASE_UNAVAILABLE
from jobs import backends, notifications
from jobs.backends import slurm as slurm_backend
from jobs.logs.progress import redis_connection
from jobs.models import ConsoleProcess, Node, ResourcePool
from jobs.runtime import debug_hold, evidence, image_prefetch, node_health, reaper, run, shell, takeover
from jobs.runtime.node_health import CheckResult

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def dispatch_pending_jobs() -> list[int]:
    """Give queued jobs their nodes, whichever backend allocates them (jobs.backends), and queue their runs."""
    started = backends.dispatch()
    for job_id in started:
        transaction.on_commit(partial(run_job.delay, job_id))
    return started


@shared_task(ignore_result=True)
def watch_slurm_jobs() -> list[int]:
    """What a backend did on its side, seen within seconds: queued jobs it started get their runs (the
    dispatch), jobs it ended are stopped (their runs end their containers themselves, and a stop task covers
    a job no live run follows), and what ended jobs still hold is given back."""
    # Beat runs this every few seconds on every console: one with no Slurm pool has nothing to look at.
    if not ResourcePool.objects.filter(backend=ResourcePool.Backend.SLURM).exists():
        return []
    dispatch_pending_jobs()
    stopping = backends.watch()
    for job_id in stopping:
        stop_job.delay(job_id)
    backends.release()
    return stopping


@shared_task(ignore_result=True)
def check_slurm_pool(pool_id: int) -> str:
    return slurm_backend.check_pool(pool_id)


@shared_task(ignore_result=True)
def run_job(job_id: int) -> None:
    try:
        run.run_allocated_job(job_id)
    finally:
        # Whatever happened, nodes may have been freed: give queued jobs their chance now.
        dispatch_pending_jobs.delay()


# A database that cannot take the stop's writes just now (locked past its busy timeout, away) has the stop tried
# again, backing off to a minute, for about a quarter of an hour, rather than dropped: the job stays Terminating
# meanwhile, and its end is written by whoever ends its containers (this task, its run, or after it the reaper).
STOP_RETRIES = 20


# No jitter: the waits are 2, 4, ... 60 s as STOP_RETRIES counts on, not a random part of each.
@shared_task(ignore_result=True, autoretry_for=DATABASE_UNAVAILABLE, retry_backoff=2, retry_backoff_max=60,
             retry_jitter=False, max_retries=STOP_RETRIES)
def stop_job(job_id: int) -> None:
    run.stop_running_job(job_id)


# A resume waits in the runs queue until a run thread takes it; the reaper sees the same stale run every
# REAPER_INTERVAL_SECONDS meanwhile, and queues it again only after this long.
RESUME_REQUEUE_SECONDS = 600


@shared_task(ignore_result=True)
def reap_orphaned_jobs() -> list[int]:
    result = reaper.reap_orphaned_jobs()
    for job in result.resumable:
        seen_heartbeat = job.heartbeat_at.isoformat() if job.heartbeat_at else None
        # The hand-over checks the owner and beat it was given, so one queued per run that went away is enough.
        if cache.add(f"console:resume-queued:{job.job_id}:{job.owner}:{seen_heartbeat}", 1, RESUME_REQUEUE_SECONDS):
            resume_job.delay(job.job_id, job.owner, seen_heartbeat)
    if result.ended:
        dispatch_pending_jobs.delay()
    # Held failed jobs whose hold is over are ended here too, so a console restarted during a hold still frees them.
    for job_id in debug_hold.expired_holds():
        if cache.add(f"console:hold-ending:{job_id}", 1, HOLD_ENDING_SECONDS):
            end_debug_hold.delay(job_id)
    # A hold has no run to watch its disk: each look checks the held containers, as a run's watch does.
    for job_id in debug_hold.held_jobs():
        if cache.add(f"console:hold-disk:{job_id}", 1, HOLD_DISK_LOOK_SECONDS):
            check_held_disk.delay(job_id)
    return result.ended


@shared_task(ignore_result=True)
def check_held_disk(job_id: int) -> None:
    """End a held job's hold at once when one of its containers is past its disk limit (jobs.runtime.debug_hold)."""
    if debug_hold.check_held_disk(job_id):
        end_debug_hold.delay(job_id)


# One evidence bundle taken at a time per job and reason (the run and the watchdog may both ask).
EVIDENCE_LOCK_SECONDS = 300


@shared_task(ignore_result=True)
def take_evidence(job_id: int, reason: str) -> None:
    """Take a failed or hung job's evidence bundle (jobs.runtime.evidence), on the control queue."""
    lock = f"console:evidence:{job_id}:{reason}"
    if not cache.add(lock, 1, EVIDENCE_LOCK_SECONDS):
        return
    try:
        evidence.take_bundle(job_id, reason)
    finally:
        cache.delete(lock)


# One look at a held job's disk queued at a time (the reaper's looks come every 15 s by default).
HOLD_DISK_LOOK_SECONDS = 10


# One end of a hold queued at a time per job: the reaper sees the expired hold on each look until it is ended.
HOLD_ENDING_SECONDS = 300


@shared_task(ignore_result=True)
def end_debug_hold(job_id: int) -> None:
    """End a held failed job's containers and free its nodes (jobs.runtime.debug_hold), once its hold is over.
    One at a time per job, whoever queued it (the reaper, or "release now"): two teardowns at once would record
    twice and reach nodes already given to another job."""
    # In Redis, not the process' cache: every control worker process sees it.
    ending = redis_connection().lock(f"console:hold-end:{job_id}", timeout=HOLD_ENDING_SECONDS)
    if not ending.acquire(blocking=False):
        return  # another task is ending it; the reaper looks again while it is still held
    try:
        if debug_hold.end_hold(job_id):
            dispatch_pending_jobs.delay()
    finally:
        ending.release()
        cache.delete(f"console:hold-ending:{job_id}")


@shared_task(ignore_result=True)
def resume_job(job_id: int, seen_owner: str, seen_heartbeat: str | None) -> None:
    """Follow on a Running job whose console process went away (see jobs.runtime.takeover)."""
    try:
        takeover.resume_run(job_id, seen_owner, datetime.fromisoformat(seen_heartbeat) if seen_heartbeat else None)
    finally:
        dispatch_pending_jobs.delay()


@worker_ready.connect
def take_up_lost_runs(**_) -> None:
    """A worker that starts (after a crash, a deploy) looks for runs to take up at once, not at the next beat."""
    try:
        reap_orphaned_jobs.delay()
    except Exception:  # the periodic reaper catches up
        logger.warning("could not queue the reaper at start", exc_info=True)


@worker_ready.connect
def prefetch_images_at_start(sender=None, **_) -> None:
    """At the console's start, the engine images go to the nodes that lack them: asked once, by the worker that
    serves the runs queue (there is one per console)."""
    queues = {queue.name for queue in getattr(getattr(sender, "task_consumer", None), "queues", [])}
    if "runs" not in queues or not settings.IMAGE_PREFETCH:
        return
    try:
        prefetch_images.delay()
    except Exception:  # a job that needs an image copies it itself
        logger.warning("could not queue the image prefetch at start", exc_info=True)


# One prefetch at a time: it holds a thread of the control worker for minutes (not a run's thread: those are
# the run slots the dispatcher counts), so a second one waits in the queue, not in a thread.
PREFETCH_LOCK = "image-prefetch"
PREFETCH_LOCK_SECONDS = 3 * 3600
PREFETCH_WAIT_SECONDS = 60


@shared_task(ignore_result=True, bind=True, max_retries=None)
def prefetch_images(self, node_ids: list[int] | None = None, version_ids: list[int] | None = None) -> None:
    """Bring the engine images to the nodes before a job needs them (jobs.runtime.image_prefetch)."""
    if not settings.IMAGE_PREFETCH:
        return
    lock = redis_connection().lock(PREFETCH_LOCK, timeout=PREFETCH_LOCK_SECONDS)
    if not lock.acquire(blocking=False):
        raise self.retry(countdown=PREFETCH_WAIT_SECONDS)
    try:
        image_prefetch.prefetch(node_ids, version_ids)
    finally:
        lock.release()


@shared_task(ignore_result=True)
def relay_shell(session_id: str) -> None:
    """A terminal in a job's container, for as long as it is open (jobs.runtime.shell), on the shells queue."""
    shell.relay_session(session_id)


def wake_dispatcher() -> None:
    try:
        # No retries: whoever asks must not wait on a broker that is away.
        dispatch_pending_jobs.apply_async(retry=False)
    except Exception:  # the periodic dispatch catches up
        logger.warning("could not queue a dispatch", exc_info=True)


def check_nodes_now(nodes: Iterable[Node]) -> list[CheckResult]:
    """Health-check these nodes in this process; a node found ready may take a queued job."""
    results = node_health.check_nodes(nodes)
    if any(result.ready for result in results):
        wake_dispatcher()
    return results


@shared_task(ignore_result=True)
def check_nodes(node_ids: list[int] | None = None) -> None:
    """Health-check the given nodes, or every enabled node (what Celery beat runs periodically)."""
    nodes = node_health.nodes_due_for_check() if node_ids is None else Node.objects.filter(pk__in=node_ids)
    for result in check_nodes_now(nodes):
        if not result.ready:
            logger.warning("node %s is not ready: %s", result.node, result.message)


@shared_task(ignore_result=True)
def notify_job_ended(job_id: int) -> None:
    """Tell a job's owner it ended (queued by name from jobs.notifications once the final state is committed)."""
    notifications.deliver_end_notice(job_id)


@shared_task(ignore_result=True)
def sweep_end_notices() -> list[int]:
    """Queue the end notices a broker that was away kept from going out."""
    return notifications.sweep_end_notices()


@shared_task(ignore_result=True)
def beat_heartbeat() -> None:
    """Beat's sign of life, sent every BEAT_HEARTBEAT_SECONDS: `runconsole` kills a beat that has gone silent and
    starts it again, and the capacity page says when the scheduler was last seen."""
    ConsoleProcess.seen(ConsoleProcess.Role.BEAT, timezone.now())
