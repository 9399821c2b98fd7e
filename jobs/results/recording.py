"""Keeping what a run left: each rank's end and the "why it failed" card, in the database."""

from collections.abc import Sequence
from datetime import UTC, datetime

from jobs.launch.plan import job_rank_workers, worker_of_rank
from jobs.models import JobStatus, LogLine, LogStream, RankOutcome, TrainingJob, Worker
from jobs.results.failure_card import (
    NCCL_ERROR,
    TRACEBACK_START,
    FailureCard,
    FailureFacts,
    explain_failure,
    first_failed_rank,
)
from jobs.results.mpirun_report import parse_mpirun_output
from jobs.results.rank_records import RankRecord

# How many of mpirun's own first lines are read for Open MPI's warnings.
MPIRUN_OPENING_LINES = 300


def launched_rank_workers(job: TrainingJob) -> tuple[int, ...]:
    """Where the job's ranks were put when it was launched (kept with its cursor); computed from the job as
    the plan did for a job whose run recorded no placement (one that never launched, or launched before
    the placement was kept)."""
    kept = (job.launch_cursor or {}).get("rank_workers")
    if isinstance(kept, list) and kept and all(isinstance(worker, int) for worker in kept):
        return tuple(kept)
    return job_rank_workers(job.launch_values())


def record_rank_records(job_id: int, records: list[RankRecord], rank_workers: Sequence[int]) -> None:
    """Keep each rank's end, on the worker whose container held its record (else where the plan put it)."""
    if not records:
        return
    nodes = dict(Worker.objects.filter(job_id=job_id).values_list("index", "node_name"))
    for record in records:
        worker = record.worker if record.worker is not None else worker_of_rank(rank_workers, record.rank)
        RankOutcome.objects.update_or_create(
            job_id=job_id,
            rank=record.rank,
            defaults={
                "worker_index": worker,
                "node_name": nodes.get(worker, ""),
                "exit_code": record.exit_code,
                "signal": record.signal,
                "stop_signal": record.stop_signal,
                "ended_at": datetime.fromtimestamp(record.ended_at, UTC) if record.ended_at else None,
            },
        )


def attempt_start(job: TrainingJob) -> int:
    """The sequence number the job's current attempt's lines follow (0 for its first attempt)."""
    return job.attempt_log_starts[-1] if job.attempt_log_starts else 0


def gather_failure_facts(job_id: int, outcome: str, exit_code: int | None, run_message: str,
                         lost_workers: dict[int, str], rank_workers: Sequence[int]) -> FailureFacts:
    job = TrainingJob.objects.select_related("spec").get(pk=job_id)
    # This attempt's lines only: an earlier attempt's failure must not explain this one's.
    lines = LogLine.objects.filter(job_id=job_id, seq__gt=attempt_start(job))
    records = {
        row.rank: RankRecord(rank=row.rank, ended_at=row.ended_at.timestamp() if row.ended_at else None,
                             exit_code=row.exit_code, signal=row.signal, stop_signal=row.stop_signal,
                             worker=row.worker_index)
        for row in job.rank_outcomes.all()
    }
    # mpirun's error blocks come last; its untagged lines are few next to the ranks'.
    mpirun_lines = [text for text in lines.filter(rank__isnull=True).exclude(stream=LogStream.SYSTEM)
                    .order_by("-seq").values_list("text", flat=True)[:400]][::-1]
    # Open MPI warns as the ranks start: its first lines, which the last ones above may not reach.
    mpirun_opening = list(lines.filter(rank__isnull=True).exclude(stream=LogStream.SYSTEM)
                          .order_by("seq").values_list("text", flat=True)[:MPIRUN_OPENING_LINES])
    first_error = (lines.filter(rank__isnull=False)
                   .filter(text__contains=TRACEBACK_START).order_by("seq").values_list("rank", flat=True).first())
    nccl = [text for text in lines.filter(text__contains="NCCL").order_by("seq").values_list("text", flat=True)[:2000]
            if NCCL_ERROR.search(text)]
    facts = FailureFacts(
        outcome=outcome, exit_code=exit_code, run_message=run_message, stop_reason=job.stop_reason,
        stop_message=job.status_message if job.stop_reason else "",
        rank_workers=rank_workers,
        nodes=dict(job.workers.values_list("index", "node_name")),
        records=records, mpirun_lines=mpirun_lines, mpirun_opening=mpirun_opening, extra_args=job.extra_args,
        first_error_rank=first_error, nccl_lines=nccl,
        silent_ranks=[item["rank"] for item in job.silent_ranks], lost_workers=lost_workers,
    )
    rank = first_failed_rank(parse_mpirun_output(mpirun_lines), records, first_error)
    if rank is not None:
        facts.rank_tail = [text for text in lines.filter(rank=rank).order_by("-seq").values_list("text", flat=True)[:200]][::-1]
    return facts


def record_failure(job_id: int, outcome: str, exit_code: int | None, run_message: str,
                   lost_workers: dict[int, str], rank_workers: Sequence[int]) -> FailureCard | None:
    """Build and keep the card of a job that did not end well; returns it (None for a job that did)."""
    job = TrainingJob.objects.get(pk=job_id)
    stopped_by_user = outcome == "stopped" or (job.status == JobStatus.TERMINATING and not job.stop_reason)
    if stopped_by_user or (outcome == "exit" and exit_code == 0):
        return None
    card = explain_failure(gather_failure_facts(job_id, outcome, exit_code, run_message, lost_workers, rank_workers))
    TrainingJob.objects.filter(pk=job_id).update(failure=card)
    return card
