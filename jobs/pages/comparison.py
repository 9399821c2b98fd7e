"""A comparison of 2-10 runs the user may see: each run's settings as plain values (secrets masked as the job
page masks them), what differs (jobs.pages.run_diff), final metrics and durations side by side, and the
metric series for the overlaid charts. The comparison page, the API and `tc compare` all serve this."""

from typing import TypedDict

from django.db.models import Q
from django.utils.translation import gettext as _

from jobs.launch.masking import MASK, looks_secret, mask_shell_text
from jobs.models import TrainingJob
from jobs.results.metric_series import thinned_series
from jobs.results.nccl_panel import nccl_report
from jobs.submission.access import visible_jobs

from .run_diff import DifferingRow, RunFacts, SideBySideRow, differing_rows, masked_rows, side_by_side

# Each series of the overlaid charts is cut to about this many points (its first, last and extremes kept).
SERIES_MAX_POINTS = 2000


class ComparedRun(TypedDict):
    id: int
    name: str
    status: str
    owner: str
    rebuilt_from: int | None
    duration_seconds: float | None


class ComparedSeries(TypedDict):
    """One line of a chart: a metric of one run (and one rank; None for a line without a rank), as
    [step or None, value] pairs in the order they were read."""

    job: int
    metric: str
    rank: int | None
    points: list[list[float | None]]


class Comparison(TypedDict):
    runs: list[ComparedRun]
    differences: list[DifferingRow]
    finals: list[SideBySideRow]
    series: list[ComparedSeries]


class UnseenJobsError(LookupError):
    """Some of the ids are not jobs the user may see; the message names them."""


def run_facts(job: TrainingJob) -> RunFacts:
    """The run's settings by section, as text, with which of them are secrets (jobs.launch.masking decides):
    what the table of differences compares. Secrets are compared as they are and masked before they are shown
    (run_diff.masked_rows); the command and OPENMPI_EXTRA_ARGS are masked here, as the job page shows them."""
    parameters = {str(item["name"]): str(item["value"]) for item in job.parameters}
    environment = {str(name): str(value) for name, value in job.env.items()}
    secrets = [(section, name) for section, values in (("parameters", parameters), ("environment", environment))
               for name, value in values.items() if looks_secret(name, value)]
    workers = sorted(job.workers.all(), key=lambda worker: worker.index)
    # NCCL's transports, read from the log (a job that logged nothing has none to read).
    transports = (nccl_report(job)["summary"].get("transports") or []) if job.log_line_count else []
    return {
        "id": job.pk,
        "name": job.name,
        "sections": {
            "parameters": parameters,
            "environment": environment,
            "engine": {"engine": job.engine_version.engine.name, "version": job.engine_version.version,
                       "image": job.engine_version.image},
            "resources": {"spec": job.spec.name, "nodes": str(job.node_count),
                          "pool": job.pool.name if job.pool else "", "extra_args": mask_shell_text(job.extra_args)},
            "code": {"code_dir": job.code_dir.name, "boot_file": job.boot_file},
            "command": {"command": mask_shell_text(job.command)},
            "placement": {f"worker-{worker.index}": worker.node_name for worker in workers},
            "nccl": {"transports": ", ".join(str(name) for name in transports)},
        },
        "secrets": secrets,
    }


def compared_series(job: TrainingJob, every_rank: bool) -> list[ComparedSeries]:
    """The job's metric series: rank 0's (or the lines without a rank), or every rank's."""
    points = job.metric_points.all()
    if not every_rank:
        points = points.filter(Q(rank=0) | Q(rank__isnull=True))
    series = thinned_series(points, ("step", "value"), SERIES_MAX_POINTS,
                            make=lambda row: [None if row[2] is None else float(row[2]), row[3]],
                            value=lambda point: point[1])
    return [{"job": job.pk, "metric": name, "rank": rank, "points": kept}
            for (name, rank), (kept, _length) in series.items()]


def comparison(user, ids: list[int], every_rank: bool = False) -> Comparison:
    """The runs `ids` (already checked by run_diff.compare_ids) compared, in the order asked; UnseenJobsError
    when one is not a job the user may see (nothing says whether it exists)."""
    found = {job.pk: job for job in visible_jobs(user).filter(pk__in=ids).select_related(
        "engine_version__engine", "spec", "pool", "code_dir", "owner").prefetch_related("workers")}
    unseen = [job_id for job_id in ids if job_id not in found]
    if unseen:
        raise UnseenJobsError(_("No job of yours (or that you may see) has the id %(ids)s.") % {
            "ids": ", ".join(f"#{job_id}" for job_id in unseen)})
    jobs = [found[job_id] for job_id in ids]
    facts = [run_facts(job) for job in jobs]
    return {
        "runs": [{"id": job.pk, "name": job.name, "status": job.status, "owner": job.owner.get_username(),
                  "rebuilt_from": job.rebuilt_from_id, "duration_seconds": job.duration_seconds} for job in jobs],
        "differences": masked_rows(differing_rows(facts), facts, MASK,
                                   owns_all=all(job.owner_id == user.pk for job in jobs)),
        "finals": side_by_side([dict(job.final_metrics or {}) for job in jobs], [job.duration_seconds for job in jobs]),
        "series": [line for job in jobs for line in compared_series(job, every_rank)],
    }
