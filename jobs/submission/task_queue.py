"""Asks the Celery workers for work by the tasks' names, so that what asks (the pages, the API, the admin,
the submission) imports neither the tasks nor the runtime they drive (`.importlinter` holds it to that).

Each call queues without retries: a request must not wait on a broker that is away, and each has a
safety net (the periodic dispatch, the job's own run seeing its stop, the periodic node check).
"""

import logging

from celery import current_app

logger = logging.getLogger(__name__)


def _queue(task: str, *args: object, expires: float | None = None) -> bool:
    try:
        current_app.send_task(task, args=args, retry=False, expires=expires)
    except Exception:  # any broker failure: the safety net named above catches up
        logger.warning("could not queue %s%s", task, args, exc_info=True)
        return False
    return True


def wake_dispatcher() -> bool:
    return _queue("jobs.tasks.dispatch_pending_jobs")


def queue_stop(job_id: int) -> bool:
    """A worker ends the containers of a job no live run follows (a followed job's run ends them itself)."""
    return _queue("jobs.tasks.stop_job", job_id)


def check_nodes_soon(node_ids: list[int] | None = None) -> bool:
    """A health check of these nodes (every enabled one with None) by a worker, within seconds."""
    return _queue("jobs.tasks.check_nodes", node_ids)


def check_slurm_pool_soon(pool_id: int) -> bool:
    """Ask a Slurm pool's slurmrestd what it is (its version, its reach) within seconds."""
    return _queue("jobs.tasks.check_slurm_pool", pool_id)


def prefetch_images_soon(node_ids: list[int] | None = None, version_ids: list[int] | None = None) -> bool:
    """Bring engine images (these versions', or all) to nodes (these, or every enabled one) before a job needs
    them: minutes of copying, one prefetch at a time (jobs.tasks.prefetch_images)."""
    return _queue("jobs.tasks.prefetch_images", node_ids, version_ids)


def open_shell(session_id: str, expires: float) -> bool:
    """The relay of a terminal in a job's container (jobs.tasks.relay_shell, on the shells queue); dropped if no
    worker takes it within `expires` seconds (its reader has stopped waiting by then)."""
    return _queue("jobs.tasks.relay_shell", session_id, expires=expires)


def end_hold_soon(job_id: int) -> bool:
    """End a held failed job's hold (jobs.tasks.end_debug_hold): its containers ended and nodes freed."""
    return _queue("jobs.tasks.end_debug_hold", job_id)
