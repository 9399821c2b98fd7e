"""Allocation: give a queued job distinct free nodes of its spec, atomically, first come first served."""

from django.db import transaction

from .models import IllegalTransition, JobStatus, Node, TrainingJob, Worker
from .platform_env import worker_hostname


def free_nodes(job: TrainingJob):
    nodes = Node.objects.filter(
        spec=job.spec, enabled=True, state=Node.State.READY, allocated_to__isnull=True
    ).order_by("name")
    if job.pool_id:
        nodes = nodes.filter(pool_id=job.pool_id)
    return nodes


def try_allocate(job: TrainingJob) -> bool:
    """Take `node_count` free nodes for the job and move it to Creating, or change nothing.

    Taking a node is a conditional update (only if still free), so two allocators racing for the
    same node cannot both win, on SQLite or PostgreSQL alike.
    """
    with transaction.atomic():
        candidates = list(free_nodes(job).values_list("pk", flat=True)[: job.node_count])
        if len(candidates) < job.node_count:
            return False
        taken = Node.objects.filter(pk__in=candidates, allocated_to__isnull=True).update(allocated_to=job)
        if taken != job.node_count:
            transaction.set_rollback(True)
            return False
        try:
            job.begin_creating()
        except IllegalTransition:
            transaction.set_rollback(True)
            return False
        nodes = Node.objects.filter(pk__in=candidates).order_by("name")
        Worker.objects.bulk_create(
            Worker(
                job=job,
                index=index,
                node=node,
                node_name=node.name,
                address=node.address,
                hostname=worker_hostname(job.dns_name, index),
            )
            for index, node in enumerate(nodes)
        )
    return True


def release_nodes(job_id: int) -> int:
    return Node.objects.filter(allocated_to_id=job_id).update(allocated_to=None)


def dispatch_pending() -> list[int]:
    """Allocate queued jobs in submission order; returns the ids that got their nodes.

    First-in first-out per spec and pool: a job that cannot be placed holds back the later jobs
    of its spec, so a large job is not starved by a stream of small ones.
    """
    started = []
    blocked: set[tuple[int, int | None]] = set()
    for job in TrainingJob.objects.filter(status=JobStatus.PENDING).order_by("created_at", "id"):
        key = (job.spec_id, job.pool_id)
        if key in blocked:
            continue
        if try_allocate(job):
            started.append(job.pk)
        else:
            blocked.add(key)
    return started


def waiting_reason(job: TrainingJob) -> str:
    if job.status != JobStatus.PENDING:
        return ""
    free = free_nodes(job).count()
    ahead = TrainingJob.objects.filter(
        status=JobStatus.PENDING, spec=job.spec, pool=job.pool, created_at__lt=job.created_at
    ).count()
    reason = f"needs {job.node_count} × {job.spec.display}, {free} free"
    if ahead:
        reason += f"; {ahead} job(s) ahead in the queue"
    return reason
