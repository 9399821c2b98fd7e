"""The allocation rule on plain values: which nodes serve a job, when a later job may pass a blocked head, and
the earliest a waiting job's nodes are sure to be free.

jobs.allocation applies it to the database (the dispatcher); jobs.start_forecast applies it to a copy of the
queue in memory (the dry run behind "with 1 node it could start now"). One rule for both, so a proposed change
is one the dispatcher would honour.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

# A queue: jobs of one spec in one pool (None: no pool) are served first come first served.
QueueKey = tuple[int, int | None]


@dataclass(frozen=True)
class NodeFact:
    """A node as the rule sees it."""

    name: str
    spec_id: int
    pool_id: int | None
    # Of no pool, or of a public pool the console allocates: capacity for jobs that name no pool.
    public: bool
    # Enabled, not draining and healthy: the allocator may give it (when no job holds it).
    usable: bool
    # Enabled by an administrator (busy, draining or unhealthy still count: it may serve again).
    enabled: bool
    holder_id: int | None = None

    @property
    def free(self) -> bool:
        return self.usable and self.holder_id is None


def serves(node: NodeFact, spec_id: int, pool_id: int | None) -> bool:
    """Whether the node could ever run a job of this spec and pool (as jobs.allocation.nodes_for)."""
    if node.spec_id != spec_id:
        return False
    return node.pool_id == pool_id if pool_id is not None else node.public


def holder_end(started_at: datetime | None, auto_stop_hours: int | None, now: datetime) -> datetime | None:
    """When a job on nodes is sure to have stopped (its auto stop); None: it has no limit."""
    if not auto_stop_hours:
        return None
    return (started_at or now) + timedelta(hours=auto_stop_hours)


def sure_free_by(missing: int, held_node_ends: Iterable[datetime | None], now: datetime) -> datetime | None:
    """The earliest `missing` more nodes are sure to be free, from the end of the job on each held node
    (None: no limit, never sure); None when that many are never sure."""
    if missing <= 0:
        return now
    ends = sorted(end for end in held_node_ends if end is not None)
    return ends[missing - 1] if len(ends) >= missing else None


def ends_before(now: datetime, auto_stop_hours: int | None, moment: datetime | None) -> bool:
    """Whether a job started now, with this auto stop, is sure to be over by `moment` (backfill's test)."""
    if moment is None or not auto_stop_hours:
        return False
    return now + timedelta(hours=auto_stop_hours) <= moment


@dataclass
class QueueGate:
    """Which queued jobs one dispatch may still try: once a queue's head could not be placed, a later job of
    that queue may only backfill (end before the head can start); a head with no bound holds its queue."""

    blocked: dict[QueueKey, datetime | None] = field(default_factory=dict)

    def may_try(self, key: QueueKey, auto_stop_hours: int | None, now: datetime) -> bool:
        return key not in self.blocked or ends_before(now, auto_stop_hours, self.blocked[key])

    def is_blocked(self, key: QueueKey) -> bool:
        return key in self.blocked

    def block(self, key: QueueKey, head_start: datetime | None) -> None:
        self.blocked.setdefault(key, head_start)


@dataclass(frozen=True)
class Request:
    """A waiting job as the rule sees it."""

    job_id: int
    spec_id: int
    pool_id: int | None
    node_count: int
    auto_stop_hours: int | None

    @property
    def key(self) -> QueueKey:
        return (self.spec_id, self.pool_id)


def dry_dispatch(queue: Sequence[Request], nodes: Sequence[NodeFact], holder_ends: dict[int, datetime | None],
                 now: datetime, free_slots: int, until: int | None = None) -> dict[int, list[str]]:
    """What one dispatch (jobs.allocation.dispatch_pending) would do now, in memory: the jobs that would get
    nodes, each with its nodes' names. `queue` is in submission order; `holder_ends` maps each job on nodes to
    its end (holder_end). With `until`, it stops after that job: the later ones cannot change its fate."""
    holders = {node.name: node.holder_id for node in nodes}
    by_name = sorted(nodes, key=lambda node: node.name)
    # Each queue's usable nodes, found once: a long queue asks for the same few queues again and again.
    serving: dict[QueueKey, list[NodeFact]] = {}
    ends = dict(holder_ends)
    started: dict[int, list[str]] = {}
    gate = QueueGate()
    for request in queue:
        if len(started) >= free_slots:
            break
        if not gate.may_try(request.key, request.auto_stop_hours, now):
            if request.job_id == until:
                break
            continue
        if request.key not in serving:
            serving[request.key] = [node for node in by_name
                                    if node.usable and serves(node, request.spec_id, request.pool_id)]
        mine = serving[request.key]
        free = [node.name for node in mine if holders[node.name] is None]
        if len(free) >= request.node_count:
            taken = free[: request.node_count]
            for name in taken:
                holders[name] = request.job_id
            started[request.job_id] = taken
            ends[request.job_id] = holder_end(None, request.auto_stop_hours, now)
        elif not gate.is_blocked(request.key):
            held_ends = [ends.get(holder) for holder in (holders[node.name] for node in mine) if holder is not None]
            gate.block(request.key, sure_free_by(request.node_count - len(free), held_ends, now))
        if request.job_id == until:
            break
    return started
