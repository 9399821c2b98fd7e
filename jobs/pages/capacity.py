"""Capacity per pool: nodes by state, GPUs free and busy, and how many jobs wait, by spec; and whether the
scheduler and the workers that serve them are alive."""

from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Count, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from console.liveness import is_stale
from jobs.models import ConsoleProcess, JobStatus, Node, ResourcePool, ResourceSpec, TrainingJob
from jobs.pages.display import spec_words

STATES = [Node.DisplayState.READY, Node.DisplayState.BUSY, Node.DisplayState.DRAINING, Node.DisplayState.NOT_READY]


@dataclass
class Capacity:
    """Counts for one spec in one pool, or summed over a pool."""

    label: str
    nodes: dict[str, int] = field(default_factory=lambda: {state: 0 for state in STATES})
    gpus_free: int = 0
    gpus_busy: int = 0
    queued_jobs: int = 0
    queued_nodes: int = 0

    @property
    def node_total(self) -> int:
        return sum(self.nodes.values())

    @property
    def node_states(self) -> list[tuple[str, int]]:
        return [(state, self.nodes[state]) for state in STATES]

    def add(self, other: "Capacity") -> None:
        for state in STATES:
            self.nodes[state] += other.nodes[state]
        self.gpus_free += other.gpus_free
        self.gpus_busy += other.gpus_busy
        self.queued_jobs += other.queued_jobs
        self.queued_nodes += other.queued_nodes


@dataclass
class PoolCapacity:
    name: str
    kind: str
    total: Capacity
    specs: list[Capacity]
    # A Slurm pool: what Slurm last said of it (jobs.backends.slurm.take_snapshot), None for the console's own.
    slurm: ResourcePool | None = None
    # The console's own pools: each node with its job, each waiting job with when it may start
    # (jobs.pages.capacity_detail); set for the reader by the page.
    detail: dict | None = None
    pool: ResourcePool | None = None


def pool_capacity() -> list[PoolCapacity]:
    """Every pool (and the nodes and jobs of no pool), each with a row per spec that has nodes or queued jobs."""
    specs = ResourceSpec.objects.in_bulk()
    rows: dict[int | None, dict[int, Capacity]] = defaultdict(dict)

    def row(pool_id: int | None, spec_id: int) -> Capacity:
        spec = specs[spec_id]
        return rows[pool_id].setdefault(spec_id, Capacity(label=f"{spec.name}: {spec_words(spec)}"))

    for node in Node.objects.only("pool_id", "spec_id", "enabled", "draining", "state", "allocated_to"):
        capacity = row(node.pool_id, node.spec_id)
        state = node.display_state
        capacity.nodes[state] += 1
        gpus = specs[node.spec_id].gpu_count
        if state == Node.DisplayState.READY:
            capacity.gpus_free += gpus
        elif node.allocated_to_id:
            capacity.gpus_busy += gpus
    queued = (
        TrainingJob.objects.filter(status=JobStatus.PENDING)
        .values("pool_id", "spec_id")
        .annotate(jobs=Count("id"), nodes=Sum("node_count"))
    )
    for entry in queued:
        capacity = row(entry["pool_id"], entry["spec_id"])
        capacity.queued_jobs += entry["jobs"]
        capacity.queued_nodes += entry["nodes"] or 0

    pools = []
    for pool in [*ResourcePool.objects.order_by("name"), None]:
        pool_id = pool.pk if pool else None
        if pool is None and not rows.get(None):
            continue
        spec_rows = sorted(rows.get(pool_id, {}).values(), key=lambda capacity: capacity.label)
        total = Capacity(label=_("All specs"))
        for capacity in spec_rows:
            total.add(capacity)
        pools.append(PoolCapacity(
            name=pool.name if pool else _("(no pool)"),
            # The label is lazy; str() reads it in the request's language, as get_kind_display() does.
            kind=pool.get_kind_display() if pool else str(ResourcePool.Kind.PUBLIC.label),
            total=total,
            specs=spec_rows,
            slurm=pool if pool is not None and pool.is_slurm else None,
            pool=pool,
        ))
    return pools


@dataclass
class ProcessLiveness:
    """One Celery process as the pages show it: how long ago it was last seen, and its last restart."""

    label: str
    seen_ago: int | None
    stale: bool
    record: ConsoleProcess | None


def console_processes() -> dict[str, object]:
    """For templates/jobs/_console_processes.html: beat, always (a console without its heartbeat has no
    scheduler), the workers `runconsole` watches, and the limit past which one is taken as hung."""
    now = timezone.now()
    records = {record.name: record for record in ConsoleProcess.objects.all()}
    shown = []
    for role in ConsoleProcess.Role:
        record = records.get(role)
        if record is None and role != ConsoleProcess.Role.BEAT:
            continue
        seen_at = record.seen_at if record else None
        shown.append(ProcessLiveness(
            label=str(role.label),
            seen_ago=int((now - seen_at).total_seconds()) if seen_at else None,
            stale=is_stale(now.timestamp(), seen_at.timestamp() if seen_at else None, settings.HUNG_PROCESS_SECONDS),
            record=record,
        ))
    return {"processes": shown, "hung_limit": settings.HUNG_PROCESS_SECONDS}
