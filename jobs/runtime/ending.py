"""How a run's end is kept: the teardown's findings, the nodes released, the job's final state.

The run, a stop from another process and the reaper all end a job through these, so a job ends the
same way whoever ends it.
"""

from collections.abc import Callable, Sequence

from django.db import transaction

from jobs.allocation import release_nodes
from jobs.models import IllegalTransition, JobStatus, Node, RunOutcome, TrainingJob, Worker
from jobs.results.recording import record_rank_records
from jobs.runtime.teardown import TeardownResult, all_rank_records, cleanup_report


def move(job_id: int, step: Callable[[TrainingJob], None]) -> bool:
    """Apply one of the job's transitions (TrainingJob.start, a lambda calling fail(...)); False if refused."""
    job = TrainingJob.objects.get(pk=job_id)
    try:
        step(job)
    except IllegalTransition:
        return False
    return True


def unclean_workers(results: Sequence[TeardownResult]) -> list[tuple[int, str]]:
    return [(result.index, result.problem) for result in results if not result.clean]


def record_teardown(job_id: int, results: Sequence[TeardownResult], rank_workers: Sequence[int]) -> None:
    """Keep what a teardown found: each rank's end (from its agent's record) and what was left on each node."""
    record_rank_records(job_id, all_rank_records(list(results)), rank_workers)
    names = dict(Worker.objects.filter(job_id=job_id).values_list("index", "node_name"))
    TrainingJob.objects.filter(pk=job_id).update(cleanup_report=cleanup_report(list(results), names))


def settle(job_id: int, outcome: str, exit_code: int | None, message: str,
           unclean: Sequence[tuple[int, str]]) -> None:
    """Release the nodes (a node that could not be cleaned is kept out of service) and record the end."""
    with transaction.atomic():
        for worker_index, problem in unclean:
            Node.objects.filter(workers__job_id=job_id, workers__index=worker_index).update(
                state=Node.State.NOT_READY, state_message=f"after job {job_id}: {problem}"
            )
        release_nodes(job_id)
    status = TrainingJob.objects.values_list("status", flat=True).get(pk=job_id)
    if status == JobStatus.TERMINATING:
        move(job_id, TrainingJob.mark_terminated)
    elif outcome == RunOutcome.EXIT and exit_code is not None:
        move(job_id, lambda job: job.finish(exit_code))
    elif outcome == RunOutcome.FAILED:
        move(job_id, lambda job: job.fail(message))
    else:
        move(job_id, lambda job: job.mark_abnormal(message))
