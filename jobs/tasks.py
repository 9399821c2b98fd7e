"""Celery tasks: thin entry points that hand over to the pipeline's stages."""

import logging

from celery import shared_task
from django.db import transaction

from . import allocation, node_health, pipeline
from .models import Node

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def dispatch_pending_jobs() -> list[int]:
    started = allocation.dispatch_pending()
    for job_id in started:
        transaction.on_commit(lambda job_id=job_id: run_job.delay(job_id))
    return started


@shared_task(ignore_result=True)
def run_job(job_id: int) -> None:
    try:
        pipeline.run_allocated_job(job_id)
    finally:
        # Whatever happened, nodes may have been freed: give queued jobs their chance now.
        dispatch_pending_jobs.delay()


@shared_task(ignore_result=True)
def stop_job(job_id: int) -> None:
    pipeline.stop_running_job(job_id)


@shared_task(ignore_result=True)
def reap_orphaned_jobs() -> list[int]:
    reaped = pipeline.reap_orphaned_jobs()
    if reaped:
        dispatch_pending_jobs.delay()
    return reaped


@shared_task(ignore_result=True)
def check_nodes(node_ids: list[int] | None = None) -> None:
    """Health-check the given nodes, or every enabled node (what Celery beat runs periodically)."""
    nodes = node_health.nodes_due_for_check() if node_ids is None else Node.objects.filter(pk__in=node_ids)
    for result in node_health.check_nodes(nodes):
        if not result.ready:
            logger.warning("node %s is not ready: %s", result.node, result.message)
