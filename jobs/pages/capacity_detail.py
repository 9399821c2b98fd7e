"""Who holds and who waits, per pool of the console's own nodes, for the capacity page: each node with the job on
it, and each waiting job with its place in its queue and the earliest it can start (from the auto stop
limits of the jobs on the nodes it needs: jobs.allocation.earliest_start).

Other users' jobs are named by number only: a user sees that a node is busy or a queue long, not what
others run (staff, who may see every job, get names and owners).
"""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from jobs.allocation import earliest_start, free_run_slots
from jobs.models import JobStatus, Node, ResourcePool, TrainingJob
from jobs.pages.waiting_forecast import ForecastJson, job_forecast, queue_state
from jobs.submission.access import visible_jobs

# The waiting jobs listed per queue (a spec in a pool: the head of each is what a reader asks about), out of
# at most WAITING_READ of the pool's.
WAITING_SHOWN = 20
WAITING_READ = 500


@dataclass(frozen=True)
class JobRef:
    """A job as the page may name it: its number always; its name and owner when the reader may see it."""

    pk: int
    name: str
    owner: str
    visible: bool
    # A failed job whose containers and nodes are held for debugging: when the hold ends.
    held_until: datetime | None = None


@dataclass(frozen=True)
class NodeRow:
    name: str
    state: str
    state_label: str
    spec: str
    job: JobRef | None


@dataclass(frozen=True)
class WaitingRow:
    position: int
    job: JobRef
    spec: str
    nodes: int
    # When it may start, in words: now, by a time (the auto stops of the jobs on its nodes), or unknown.
    when: str
    # Why it waits and what would start it sooner (jobs.start_forecast).
    forecast: ForecastJson | None = None


def _ref(job: TrainingJob, visible_ids: set[int]) -> JobRef:
    visible = job.pk in visible_ids
    return JobRef(job.pk, job.name if visible else "", job.owner.get_username() if visible else "", visible,
                  job.held_until if job.is_held_for_debugging else None)


def pool_detail(user, pool: ResourcePool | None) -> dict[str, list]:
    """The nodes and the waiting jobs of one of the console's own pools (None: the nodes of no pool)."""
    nodes = list(Node.objects.filter(pool=pool).select_related("spec", "allocated_to__owner").order_by("name"))
    pending = (TrainingJob.objects.filter(status=JobStatus.PENDING, pool=pool).select_related("spec", "owner")
               .order_by("created_at", "id")[:WAITING_READ])
    per_spec: dict[int, int] = {}
    waiting = []
    for job in pending:
        per_spec[job.spec_id] = per_spec.get(job.spec_id, 0) + 1
        if per_spec[job.spec_id] <= WAITING_SHOWN:
            waiting.append(job)
    holders = {node.allocated_to_id for node in nodes if node.allocated_to_id}
    visible_ids = set(visible_jobs(user).filter(Q(pk__in=holders) | Q(pk__in=[job.pk for job in waiting]))
                      .values_list("pk", flat=True))
    slots = free_run_slots()
    node_rows = [NodeRow(node.name, node.display_state, str(Node.DisplayState(node.display_state).label),
                         node.spec.name, _ref(node.allocated_to, visible_ids) if node.allocated_to else None)
                 for node in nodes]
    positions: dict[int, int] = {}
    state = queue_state()
    waiting_rows = []
    for job in waiting:
        # Each spec has its own queue in a pool: the place counts the jobs of that spec ahead.
        positions[job.spec_id] = positions.get(job.spec_id, 0) + 1
        start = earliest_start(job)
        # "Now" read after the start: a job whose nodes are free gets the time of that reading.
        when = waiting_words(start, positions[job.spec_id] - 1, timezone.now(), slots)
        waiting_rows.append(WaitingRow(positions[job.spec_id], _ref(job, visible_ids), job.spec.name, job.node_count,
                                       when, job_forecast(job, state)))
    return {"nodes": node_rows, "waiting": waiting_rows}


def waiting_words(start: datetime | None, ahead: int, now: datetime, free_slots: int = 1) -> str:
    """When a waiting job may start: from the earliest its nodes are sure to be free, the jobs ahead of it, and
    the console's free run slots (a job whose nodes are free still waits for a worker thread)."""
    if start is None:
        return _("unknown: a job on the nodes it needs has no auto stop limit")
    if start <= now:
        if ahead:
            return _("enough nodes are free; %(ahead)s job(s) ahead of it go first") % {"ahead": ahead}
        if free_slots <= 0:
            return _("its nodes are free; it waits for a run slot (every worker thread runs a job)")
        return _("its nodes are free: it starts at the next dispatch")
    words = _("its nodes are sure to be free by about %(time)s (the auto stops of the jobs on them)") % {
        "time": timezone.localtime(start).strftime("%Y-%m-%d %H:%M")}
    if ahead:
        words += " " + _("%(ahead)s job(s) ahead of it go first.") % {"ahead": ahead}
    return words
