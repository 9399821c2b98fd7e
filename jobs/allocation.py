"""Allocation: give a queued job distinct free nodes of its spec, atomically, first come first served.

The queue is first-in first-out per (spec, pool): jobs that want the same nodes are served in
submission order, and a job that cannot be placed holds back the later ones rather than being
starved by a stream of smaller jobs. Jobs that want other nodes are not held back by it. (Jobs
that name no pool and jobs of a public pool draw on the same public nodes from two queues.)

Backfill, as Slurm's: a later job may start ahead of the job at the head of its queue when it cannot
delay it. The head's earliest start is bounded by the auto stop limits of the jobs holding the nodes it
waits for; a later job whose own auto stop ends before then runs on the free nodes meanwhile. A job
with no limit never jumps the queue, and no job jumps a head whose start has no bound.
"""

import enum
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs.launch.platform_env import worker_hostname

from .allocation_rule import QueueGate, holder_end, sure_free_by
from .allocation_rule import ends_before as ends_before_moment
from .models import IllegalTransition, JobStatus, Node, ResourcePool, TrainingJob, Worker


def nodes_for(job: TrainingJob):
    """Every node the job could ever run on: its spec, in its pool.

    A job that names no pool runs on public capacity only (nodes of no pool or of a public
    pool); a dedicated pool's nodes serve the jobs submitted to it.
    """
    nodes = Node.objects.filter(spec_id=job.spec_id)
    if job.pool_id:
        return nodes.filter(pool_id=job.pool_id)
    # A Slurm pool's nodes are Slurm's to give (jobs.backends.slurm), never public capacity.
    return nodes.filter(Q(pool__isnull=True) | Q(pool__kind=ResourcePool.Kind.PUBLIC,
                                                  pool__backend=ResourcePool.Backend.CONSOLE))


def free_nodes(job: TrainingJob):
    return nodes_for(job).filter(
        enabled=True, draining=False, state=Node.State.READY, allocated_to__isnull=True
    ).order_by("name")


# The states of a job whose run holds a worker thread.
RUN_STATES = (JobStatus.CREATING, JobStatus.RUNNING, JobStatus.TERMINATING)


class Outcome(enum.Enum):
    ALLOCATED = "allocated"
    TOO_FEW_NODES = "too few free nodes"
    NOT_PENDING = "no longer pending"


def allocate(job: TrainingJob) -> Outcome:
    """Take `node_count` free nodes for the job and move it to Creating, or change nothing.

    The candidates are locked in name order (PostgreSQL: FOR UPDATE; SQLite has one writer at a
    time already): concurrent allocators queue on a contested node instead of both taking it, and
    the one order rules out deadlocks between them. A waiter then sees the node taken and moves on.
    Taking a node is still a conditional update, so two allocators can never both win one node.
    """
    with transaction.atomic():
        candidates = list(
            free_nodes(job).select_for_update(of=("self",)).values_list("pk", flat=True)[: job.node_count]
        )
        if len(candidates) < job.node_count:
            return Outcome.TOO_FEW_NODES
        return assign(job, candidates)


def assign(job: TrainingJob, node_ids: list[int]) -> Outcome:
    """Give the job these nodes (in the given order, worker-0 first) and move it to Creating, or change nothing.
    The allocator calls it with the free nodes it chose; a Slurm pool with the nodes Slurm allocated."""
    with transaction.atomic():
        taken = Node.objects.filter(pk__in=node_ids, allocated_to__isnull=True).update(allocated_to=job)
        if taken != len(node_ids):
            transaction.set_rollback(True)
            return Outcome.TOO_FEW_NODES
        try:
            job.begin_creating()
        except IllegalTransition:
            transaction.set_rollback(True)
            return Outcome.NOT_PENDING
        nodes = Node.objects.in_bulk(node_ids)
        Worker.objects.bulk_create(
            Worker(
                job=job,
                index=index,
                node=nodes[node_id],
                node_name=nodes[node_id].name,
                address=nodes[node_id].address,
                hostname=worker_hostname(job.dns_name, index),
            )
            for index, node_id in enumerate(node_ids)
        )
    return Outcome.ALLOCATED


def try_allocate(job: TrainingJob) -> bool:
    return allocate(job) is Outcome.ALLOCATED


def release_nodes(job_id: int) -> int:
    return Node.objects.filter(allocated_to_id=job_id).update(allocated_to=None)


def free_run_slots() -> int:
    """How many more jobs the console's workers can run now (settings.RUN_SLOTS less the runs under way)."""
    return settings.RUN_SLOTS - TrainingJob.objects.filter(status__in=RUN_STATES).count()


def dispatch_pending() -> list[int]:
    """Allocate queued jobs in submission order, backfilling where it delays no head; returns who got nodes.

    No more jobs start than there are free run slots. (Two dispatchers at once may each count the same
    free slot; the job that gets it second waits for a worker thread, as every job did before the cap.)
    """
    started: list[int] = []
    slots = free_run_slots()
    # The rule of jobs.allocation_rule, which the dry run of jobs.start_forecast applies too.
    gate = QueueGate()
    queued = TrainingJob.objects.filter(status=JobStatus.PENDING).exclude(pool__backend=ResourcePool.Backend.SLURM)
    for job in queued.order_by("created_at", "id"):
        if len(started) >= slots:
            break
        key = (job.spec_id, job.pool_id)
        if not gate.may_try(key, job.auto_stop_hours, timezone.now()):
            continue
        outcome = allocate(job)
        if outcome is Outcome.ALLOCATED:
            started.append(job.pk)
        elif outcome is Outcome.TOO_FEW_NODES and not gate.is_blocked(key):
            gate.block(key, earliest_start(job))
        # NOT_PENDING: another dispatcher placed it (or it was stopped); the next job may go.
    return started


def ends_before(job: TrainingJob, moment: datetime | None) -> bool:
    """Whether the job, started now, is sure to be over (its auto stop) by `moment`."""
    return ends_before_moment(timezone.now(), job.auto_stop_hours, moment)


def earliest_start(job: TrainingJob) -> datetime | None:
    """The latest the nodes a waiting job needs are sure to be free, from the auto stops of their jobs; None without a bound."""
    usable = nodes_for(job).filter(enabled=True, draining=False, state=Node.State.READY)
    # Two reads whatever the size of the pool: the capacity page asks this of every waiting job it lists.
    holders = Counter(usable.values_list("allocated_to_id", flat=True))
    missing = job.node_count - holders.pop(None, 0)
    now = timezone.now()
    if missing <= 0:
        return now
    ends: list[datetime | None] = []
    for holder, started_at, hours, held_until in TrainingJob.objects.filter(pk__in=list(holders)).values_list(
            "pk", "started_at", "auto_stop_hours", "held_until"):
        # A failed job held for debugging frees its nodes when the hold ends.
        ends.extend([held_until or holder_end(started_at, hours, now)] * holders[holder])
    return sure_free_by(missing, ends, now)


def runnable_nodes(spec, pool):
    """The nodes a job of this spec and pool could ever have (enabled ones, busy or not)."""
    return nodes_for(TrainingJob(spec=spec, pool=pool)).filter(enabled=True)


def runnable_node_count(spec, pool) -> int:
    return runnable_nodes(spec, pool).count()


def jobs_ahead(job: TrainingJob):
    """The queued jobs that will be served before this one (same spec and pool, submitted earlier)."""
    earlier = Q(created_at__lt=job.created_at) | Q(created_at=job.created_at, pk__lt=job.pk)
    return TrainingJob.objects.filter(earlier, status=JobStatus.PENDING, spec_id=job.spec_id, pool_id=job.pool_id)


def queue_position(job: TrainingJob) -> int | None:
    """1 for the job served next; None when the job is not queued."""
    if job.status != JobStatus.PENDING:
        return None
    return jobs_ahead(job).count() + 1


@dataclass(frozen=True)
class NodeCounts:
    free: int
    busy: int
    not_ready: int
    draining: int

    @property
    def total(self) -> int:
        return self.free + self.busy + self.not_ready + self.draining


def node_counts(job: TrainingJob) -> NodeCounts:
    counts = {state: 0 for state in Node.DisplayState.values}
    for node in nodes_for(job).only("enabled", "state", "draining", "allocated_to"):
        counts[node.display_state] += 1
    return NodeCounts(
        free=counts[Node.DisplayState.READY],
        busy=counts[Node.DisplayState.BUSY],
        not_ready=counts[Node.DisplayState.NOT_READY],
        draining=counts[Node.DisplayState.DRAINING],
    )


def waiting_reason(job: TrainingJob) -> str:
    """Why a queued job waits.

    E.g. "needs 2 × CPU: 2 cores | Memory: 4 GB, 1 free (1 busy); position 1 in the queue".
    """
    if job.status != JobStatus.PENDING:
        return ""
    if job.pool is not None and job.pool.is_slurm:
        # Slurm decides, and says why (jobs.backends.slurm keeps its reason in words).
        if not job.slurm_job_id:
            return job.slurm_reason or "being submitted to Slurm"
        return f"Slurm job {job.slurm_job_id}: {job.slurm_reason or 'queued'}"
    counts = node_counts(job)
    others = [f"{count} {label}" for count, label in
              ((counts.busy, "busy"), (counts.not_ready, "not ready"), (counts.draining, "draining")) if count]
    reason = f"needs {job.node_count} × {job.spec.display}, {counts.free} free"
    if others:
        reason += f" ({', '.join(others)})"
    if counts.total < job.node_count:
        reason += f"; the pool has only {counts.total} node(s) of this spec"

    position = queue_position(job)
    assert position is not None, "a pending job (checked above) has a place in the queue"
    reason += f"; position {position} in the queue"
    if position > 1:
        reason += f", {position - 1} job(s) ahead"
    # Beside the nodes, not instead of them: a free slot does not help a job whose nodes are missing.
    if free_run_slots() <= 0:
        reason += (f"; and every run slot is taken: {settings.RUN_SLOTS} job(s) being prepared, running or "
                   "stopped, the most the console runs at once (RUN_SLOTS)")
    return reason
