"""The start forecast of waiting jobs (jobs.start_forecast) read from the database, for the job page, the
capacity page and the API. A Slurm pool's job gets what Slurm says of it, and no estimate of the console's."""

from typing import TypedDict

from django.utils import timezone
from django.utils.translation import gettext as _

from jobs.allocation import free_run_slots, waiting_reason
from jobs.allocation_rule import NodeFact, Request, holder_end
from jobs.models import JobStatus, Node, ResourcePool, TrainingJob
from jobs.start_forecast import Forecast, QueueState, forecast


class AlternativeJson(TypedDict):
    kind: str
    words: str
    node_count: int
    pool: str | None
    auto_stop_hours: int | None


class ForecastJson(TypedDict):
    scheduler: str
    position: int | None
    ahead: int | None
    reason: str
    estimate: str
    starts_now: bool
    never: bool
    earliest: str | None
    latest: str | None
    alternatives: list[AlternativeJson]


def queue_state() -> QueueState:
    """The console's own queue now: its waiting jobs in submission order, its nodes and their holders."""
    now = timezone.now()
    console = ResourcePool.Backend.CONSOLE
    nodes = [
        NodeFact(name=node.name, spec_id=node.spec_id, pool_id=node.pool_id,
                 public=node.pool is None or (node.pool.kind == ResourcePool.Kind.PUBLIC and node.pool.backend == console),
                 usable=node.enabled and not node.draining and node.state == Node.State.READY,
                 enabled=node.enabled, holder_id=node.allocated_to_id)
        for node in Node.objects.select_related("pool").exclude(pool__backend=ResourcePool.Backend.SLURM)
    ]
    holder_ids = {node.holder_id for node in nodes if node.holder_id is not None}
    # A failed job held for debugging frees its nodes when its hold ends, whatever its auto stop said.
    holder_ends = {pk: held_until or holder_end(started_at, hours, now) for pk, started_at, hours, held_until in
                   TrainingJob.objects.filter(pk__in=holder_ids).values_list("pk", "started_at", "auto_stop_hours",
                                                                             "held_until")}
    queue = [Request(pk, spec_id, pool_id, node_count, hours) for pk, spec_id, pool_id, node_count, hours in
             TrainingJob.objects.filter(status=JobStatus.PENDING).exclude(pool__backend=ResourcePool.Backend.SLURM)
             .order_by("created_at", "id").values_list("pk", "spec_id", "pool_id", "node_count", "auto_stop_hours")]
    pools: dict[int | None, str] = {None: _("the public nodes (no pool)")}
    pools.update((pk, _("the pool %(pool)s") % {"pool": name}) for pk, name in
                 ResourcePool.objects.filter(backend=console).values_list("pk", "name"))
    return QueueState(queue=queue, nodes=nodes, holder_ends=holder_ends, pools=pools, free_slots=free_run_slots(),
                      now=now)


def job_forecast(job: TrainingJob, state: QueueState | None = None) -> ForecastJson | None:
    """The forecast of a waiting job; None for a job that does not wait."""
    if job.status != JobStatus.PENDING:
        return None
    if job.pool is not None and job.pool.is_slurm:
        return ForecastJson(scheduler="slurm", position=None, ahead=None, reason=waiting_reason(job),
                            estimate=_("Slurm decides when it starts"), starts_now=False, never=False,
                            earliest=None, latest=None, alternatives=[])
    state = state or queue_state()
    if not any(request.job_id == job.pk for request in state.queue):
        return None
    return forecast_json(forecast(state, job.pk), state)


def forecast_json(result: Forecast, state: QueueState) -> ForecastJson:
    names = {pk: name for pk, name in ResourcePool.objects.values_list("pk", "name")}
    return ForecastJson(
        scheduler="console", position=result.position, ahead=result.ahead, reason=result.reason,
        estimate=result.estimate, starts_now=result.starts_now, never=result.never,
        earliest=result.earliest.isoformat() if result.earliest else None,
        latest=result.latest.isoformat() if result.latest else None,
        alternatives=[AlternativeJson(kind=str(alternative.kind), words=alternative.words,
                                      node_count=alternative.node_count,
                                      pool=names.get(alternative.pool_id) if alternative.pool_id else None,
                                      auto_stop_hours=alternative.auto_stop_hours)
                      for alternative in result.alternatives])
