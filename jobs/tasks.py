"""Celery tasks: thin entry points into the stages. The only module that calls into jobs.runtime."""

import logging
from collections.abc import Iterable
from functools import partial

from celery import shared_task
from django.db import transaction

from jobs import allocation
from jobs.models import Node
from jobs.runtime import node_health, reaper, run
from jobs.runtime.node_health import CheckResult

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def dispatch_pending_jobs() -> list[int]:
    started = allocation.dispatch_pending()
    for job_id in started:
        transaction.on_commit(partial(run_job.delay, job_id))
    return started


@shared_task(ignore_result=True)
def run_job(job_id: int) -> None:
    try:
        run.run_allocated_job(job_id)
    finally:
        # Whatever happened, nodes may have been freed: give queued jobs their chance now.
        dispatch_pending_jobs.delay()


@shared_task(ignore_result=True)
def stop_job(job_id: int) -> None:
    run.stop_running_job(job_id)


@shared_task(ignore_result=True)
def reap_orphaned_jobs() -> list[int]:
    reaped = reaper.reap_orphaned_jobs()
    if reaped:
        dispatch_pending_jobs.delay()
    return reaped


def wake_dispatcher() -> None:
    try:
        dispatch_pending_jobs.delay()
    except Exception:  # noqa: BLE001 - the periodic dispatch catches up; a check must not fail for it
        logger.warning("could not queue a dispatch", exc_info=True)


def check_nodes_now(nodes: Iterable[Node]) -> list[CheckResult]:
    """Health-check these nodes in this process (the admin's "check now"); a node found ready may take a queued job."""
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
