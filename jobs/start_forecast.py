"""When a waiting job may start, and what would start it sooner, from plain values (no database).

For each waiting job of the console's own pools: its place in its queue, why it waits in words, a range for its
start (from the auto stops of the jobs that hold the nodes and of the jobs ahead of it), and alternatives. Each
alternative is proven by a dry run of the dispatcher's own rule (jobs.allocation_rule.dry_dispatch) on the
changed request: only what would start at the next dispatch is proposed.

The range: the latest assumes every job ahead runs to its auto stop; the earliest assumes the jobs ahead end as
soon as they start. Both assume the running jobs run to their auto stops (a job that ends sooner starts this
one sooner); "unknown" when a job it waits on has no auto stop.
"""

import enum
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .allocation_rule import NodeFact, QueueKey, Request, dry_dispatch, holder_end, serves

# The longest auto stop (hours) the shorter-limit search proposes for a job that has none.
LONGEST_PROPOSED_HOURS = 24 * 30


class AlternativeKind(enum.StrEnum):
    FEWER_NODES = "fewer_nodes"
    OTHER_POOL = "other_pool"
    SHORTER_AUTO_STOP = "shorter_auto_stop"


@dataclass(frozen=True)
class Alternative:
    """A change to the request that would start it at the next dispatch (proven by a dry run)."""

    kind: AlternativeKind
    words: str
    node_count: int
    pool_id: int | None
    auto_stop_hours: int | None


@dataclass(frozen=True)
class Forecast:
    position: int
    ahead: int
    reason: str
    # Said in words: now, a range, unknown or never.
    estimate: str
    starts_now: bool
    # Its pool has fewer enabled nodes of its spec than it needs: it can never start there.
    never: bool
    earliest: datetime | None
    latest: datetime | None
    alternatives: list[Alternative]


@dataclass(frozen=True)
class QueueState:
    """Everything the forecast reads: the waiting jobs in submission order, the nodes, when each job on nodes
    stops (jobs.allocation_rule.holder_end), the console's own pools a job may be sent to (None: no pool) with
    their names, the free run slots, and now."""

    queue: Sequence[Request]
    nodes: Sequence[NodeFact]
    holder_ends: dict[int, datetime | None]
    pools: dict[int | None, str]
    free_slots: int
    now: datetime
    # sure_starts of the whole queue, by hold_ahead: worked out once for all the jobs a page forecasts.
    sure_starts_cache: dict[bool, dict[int, datetime | None]] = field(default_factory=dict, compare=False)

    def starts(self, queue: Sequence[Request], job_id: int) -> bool:
        return job_id in dry_dispatch(queue, self.nodes, self.holder_ends, self.now, self.free_slots, until=job_id)


def sure_starts(state: QueueState, hold_ahead: bool) -> dict[int, datetime | None]:
    """The start of each waiting job when the nodes are taken in queue order as they are sure to be free; a job
    ahead holds its nodes for its auto stop (hold_ahead) or gives them back at once. None: no bound."""
    if hold_ahead not in state.sure_starts_cache:
        state.sure_starts_cache[hold_ahead] = queue_sure_starts(state, hold_ahead)
    return state.sure_starts_cache[hold_ahead]


def queue_sure_starts(state: QueueState, hold_ahead: bool) -> dict[int, datetime | None]:
    now = state.now
    free_at: dict[str, datetime | None] = {
        node.name: now if node.holder_id is None else state.holder_ends.get(node.holder_id)
        for node in state.nodes if node.usable}
    floor: dict[QueueKey, datetime] = {}
    unbounded: set[QueueKey] = set()
    starts: dict[int, datetime | None] = {}
    serving: dict[QueueKey, list[str]] = {}

    def order(name: str) -> tuple[bool, datetime, str]:
        # The nodes sure to be free soonest first (never sure last), by name among equals, as the allocator.
        end = free_at[name]
        return (end is None, end or now, name)

    ordered = {name: order(name) for name in free_at}
    for request in state.queue:
        if request.key in unbounded:
            # First come first served: no later job of this queue has a bound either.
            starts[request.job_id] = None
            continue
        if request.node_count <= 0:
            # No node to wait for (a record the form would refuse): it holds nothing up.
            starts[request.job_id] = floor.get(request.key, now)
            continue
        if request.key not in serving:
            serving[request.key] = [node.name for node in state.nodes
                                    if node.usable and serves(node, request.spec_id, request.pool_id)]
        chosen = heapq.nsmallest(request.node_count, serving[request.key], key=ordered.__getitem__)
        last = free_at[chosen[-1]] if len(chosen) == request.node_count and chosen else None
        if last is None:
            # First come first served: no later job of this queue has a bound either.
            unbounded.add(request.key)
            starts[request.job_id] = None
            continue
        start = max(last, floor.get(request.key, now))
        floor[request.key] = start
        starts[request.job_id] = start
        for name in chosen:
            free_at[name] = holder_end(start, request.auto_stop_hours, now) if hold_ahead else start
            ordered[name] = order(name)
    return starts


def forecast(state: QueueState, job_id: int) -> Forecast:
    """The forecast of one waiting job of `state.queue`."""
    request = next(entry for entry in state.queue if entry.job_id == job_id)
    ahead = sum(1 for entry in state.queue[: state.queue.index(request)] if entry.key == request.key)
    mine = [node for node in state.nodes if serves(node, request.spec_id, request.pool_id)]
    never = sum(node.enabled for node in mine) < request.node_count
    starts_now = not never and state.starts(state.queue, job_id)
    earliest = latest = None
    if not never and not starts_now:
        earliest = sure_starts(state, hold_ahead=False)[job_id]
        latest = sure_starts(state, hold_ahead=True)[job_id]
    alternatives = [] if starts_now else alternatives_for(state, request)
    return Forecast(
        position=ahead + 1, ahead=ahead, reason=reason_words(state, request, mine, ahead, never, starts_now),
        estimate=estimate_words(state, mine, request, never, starts_now, earliest, latest),
        starts_now=starts_now, never=never, earliest=earliest, latest=latest, alternatives=alternatives)


def alternatives_for(state: QueueState, request: Request) -> list[Alternative]:
    """Fewer nodes, another pool, a shorter auto stop: each only if the dry run starts it. A waiting job cannot
    be changed, only submitted again (a Rebuild): each is tried as a new submission, last in its queue."""
    found: list[Alternative] = []
    others = [entry for entry in state.queue if entry.job_id != request.job_id]

    def in_place(changed: Request) -> list[Request]:
        return [*others, changed]

    for count in range(request.node_count - 1, 0, -1):
        if state.starts(in_place(replace(request, node_count=count)), request.job_id):
            found.append(Alternative(AlternativeKind.FEWER_NODES, ngettext(
                "submitted again with %(count)s node, it could start now",
                "submitted again with %(count)s nodes, it could start now", count)
                % {"count": count}, count, request.pool_id, request.auto_stop_hours))
            break
    for pool_id, pool_name in state.pools.items():
        if pool_id == request.pool_id:
            continue
        if state.starts(in_place(replace(request, pool_id=pool_id)), request.job_id):
            free = sum(1 for node in state.nodes if node.free and serves(node, request.spec_id, pool_id))
            found.append(Alternative(AlternativeKind.OTHER_POOL, ngettext(
                "%(pool)s has %(free)s free node of this spec: submitted there, it could start now",
                "%(pool)s has %(free)s free nodes of this spec: submitted there, it could start now", free)
                % {"pool": pool_name, "free": free}, request.node_count, pool_id, request.auto_stop_hours))
    hours = longest_backfill_hours(state, request, in_place)
    if hours is not None:
        found.append(Alternative(AlternativeKind.SHORTER_AUTO_STOP, ngettext(
            "submitted again with an auto stop of at most %(hours)s hour, it could start now, on free nodes, "
            "done before the job ahead needs them",
            "submitted again with an auto stop of at most %(hours)s hours, it could start now, on free nodes, "
            "done before the job ahead needs them", hours) % {"hours": hours}, request.node_count, request.pool_id, hours))
    return found


def longest_backfill_hours(state: QueueState, request: Request,
                           in_place: Callable[[Request], list[Request]]) -> int | None:
    """The longest auto stop, shorter than the job's, with which it would backfill now; None if none would.
    A shorter limit never hurts (backfill asks the job to end by a moment), so a binary search finds it."""
    longest = (request.auto_stop_hours or LONGEST_PROPOSED_HOURS + 1) - 1

    def starts_with(hours: int) -> bool:
        return bool(state.starts(in_place(replace(request, auto_stop_hours=hours)), request.job_id))

    if longest < 1 or not starts_with(1):
        return None
    low, high = 1, longest
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if starts_with(middle) else (low, middle - 1)
    return low


def moment_words(moment: datetime, now: datetime) -> str:
    local = timezone.localtime(moment)
    # The console's time zone, named: the page's other times are the browser's own.
    shown = local.strftime("%H:%M") if local.date() == timezone.localtime(now).date() else local.strftime("%Y-%m-%d %H:%M")
    return f"{shown} {local.tzname()}"


def reason_words(state: QueueState, request: Request, mine: list[NodeFact], ahead: int, never: bool,
                 starts_now: bool) -> str:
    if never:
        return _("it can never start in its pool: %(have)s enabled node(s) of its spec are left, it needs "
                 "%(need)s") % {"have": sum(node.enabled for node in mine), "need": request.node_count}
    free = sum(1 for node in mine if node.free)
    if starts_now:
        return _("%(free)s of the %(need)s node(s) it needs are free: it starts at the next dispatch") % {
            "free": free, "need": request.node_count}
    parts = [_("it needs %(need)s node(s), %(free)s free") % {"need": request.node_count, "free": free}]
    held: dict[int, int] = {}
    for node in mine:
        if node.usable and node.holder_id is not None:
            held[node.holder_id] = held.get(node.holder_id, 0) + 1
    if free < request.node_count and held:
        far = state.now + timedelta(days=36500)
        holders = sorted(held, key=lambda holder: state.holder_ends.get(holder) or far)
        parts.append(_("the others are held by %(holders)s") % {"holders": ", ".join(
            holder_words(holder, held[holder], state.holder_ends.get(holder), state.now) for holder in holders)})
    unusable = sum(1 for node in mine if node.enabled and not node.usable)
    if unusable:
        parts.append(_("%(count)s of its nodes are not ready or draining") % {"count": unusable})
    if ahead:
        parts.append(_("%(ahead)s job(s) ahead of it in its queue go first") % {"ahead": ahead})
    if free >= request.node_count and state.free_slots <= 0:
        parts.append(_("every run slot is taken"))
    return "; ".join(parts)


def holder_words(holder: int, nodes: int, end: datetime | None, now: datetime) -> str:
    if end is None:
        return _("#%(job)s (%(nodes)s node(s), no auto stop limit)") % {"job": holder, "nodes": nodes}
    return _("#%(job)s (%(nodes)s node(s)) until about %(time)s") % {
        "job": holder, "nodes": nodes, "time": moment_words(end, now)}


def estimate_words(state: QueueState, mine: list[NodeFact], request: Request, never: bool, starts_now: bool,
                   earliest: datetime | None, latest: datetime | None) -> str:
    if never:
        return _("never in this pool")
    if starts_now:
        return _("now, at the next dispatch")
    if latest is None or earliest is None:
        if sum(1 for node in mine if node.usable) < request.node_count:
            return _("unknown: it waits for nodes that are not ready or draining")
        return _("unknown: a job it waits on has no auto stop limit")
    if latest <= state.now:
        # Its nodes are free but it is not started: the run slots are all taken, or a head holds its queue.
        return _("as soon as a run slot is free") if state.free_slots <= 0 else _("at a coming dispatch")
    if earliest >= latest:
        return _("by about %(latest)s (sooner if a job ends before its auto stop)") % {
            "latest": moment_words(latest, state.now)}
    return _("between about %(earliest)s and %(latest)s (sooner if a job ends before its auto stop)") % {
        "earliest": moment_words(earliest, state.now), "latest": moment_words(latest, state.now)}
