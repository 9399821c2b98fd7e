"""How a run's end is kept: the teardown's findings, the nodes released, the job's final state.

The run, a stop from another process and the reaper all end a job through these, so a job ends the
same way whoever ends it.
"""

from collections.abc import Callable, Sequence

from django.db import transaction

from jobs.allocation import release_nodes
from jobs.logs.store import service_line
from jobs.models import (
    FINAL_STATES,
    SLURM_PREEMPTING,
    SLURM_REQUEUED,
    SLURM_VANISHED,
    IllegalTransition,
    JobEvent,
    JobStatus,
    Node,
    RunOutcome,
    StopReason,
    TrainingJob,
    Worker,
)
from jobs.results.checkpoints import close_attempt
from jobs.results.recording import launched_rank_workers as launched_rank_workers  # the run imports it from here
from jobs.results.recording import record_rank_records
from jobs.runtime.teardown import TeardownResult, all_rank_records, cleanup_report

# How often settle looks again when a transition is refused under it (a stop, a force release).
SETTLE_LOOKS = 3


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
    # One transaction: the nodes are free exactly when the job's end is recorded, never while it still
    # reads Running (another job could take them), and a job is never left Running without its nodes.
    with transaction.atomic():
        # The attempt's lost work is measured at its end, whichever way it ends (queued again included).
        close_attempt(job_id, message or (f"exit status {exit_code}" if exit_code is not None else outcome),
                      completed=outcome == RunOutcome.EXIT and exit_code == 0)
        release_after_teardown(job_id, unclean)
        # A stop can come between reading the state and moving it: the job then ends as a stopped one, on
        # the next look. A state that keeps changing under it is not let go: the transaction (the nodes'
        # release with it) is undone, and the job is left to the reaper rather than freed without an end.
        for _look in range(SETTLE_LOOKS):
            if end_as(job_id, outcome, exit_code, message):
                return
        raise IllegalTransition(f"job {job_id}: its end could not be recorded, its state kept changing")


def release_after_teardown(job_id: int, unclean: Sequence[tuple[int, str]]) -> None:
    """Free the job's nodes, keeping out of service each one its teardown could not clean."""
    for worker_index, problem in unclean:
        # Only a node the job still holds: one force-released meanwhile may be another job's by now.
        Node.objects.filter(workers__job_id=job_id, workers__index=worker_index, allocated_to_id=job_id).update(
            state=Node.State.NOT_READY, state_message=f"after job {job_id}: {problem}"
        )
    release_nodes(job_id)


def end_as(job_id: int, outcome: str, exit_code: int | None, message: str) -> bool:
    """Move the job to the final state its run's outcome says (or queue it again); False if a stop came between."""
    status = TrainingJob.objects.values_list("status", flat=True).get(pk=job_id)
    if status in FINAL_STATES or status == JobStatus.PENDING:
        return True
    if status == JobStatus.TERMINATING:
        return end_stop(job_id)
    if not (outcome == RunOutcome.EXIT and exit_code == 0) and restart(job_id):
        return True
    if outcome == RunOutcome.EXIT and exit_code is not None:
        return move(job_id, lambda job: job.finish(exit_code))
    if outcome == RunOutcome.FAILED:
        return move(job_id, lambda job: job.fail(message))
    return move(job_id, lambda job: job.mark_abnormal(message))


# What Slurm did when it stopped a running job (jobs.backends.slurm) that puts the job back in the queue:
# Slurm requeues the same Slurm job (`--requeue`), and the console's job waits for it as its next attempt.
SLURM_REQUEUES = frozenset({SLURM_REQUEUED, SLURM_PREEMPTING, "PREEMPTED", "NODE_FAIL"})


def end_stop(job_id: int) -> bool:
    """The end of a stop, once the containers are gone: Terminated, but for what Slurm stopped the job for."""
    job = TrainingJob.objects.get(pk=job_id)
    if job.stop_reason == StopReason.SLURM and job.slurm_state in SLURM_REQUEUES:
        return requeue_after_slurm(job)
    if job.stop_reason == StopReason.SLURM and job.slurm_state == SLURM_VANISHED:
        return move(job_id, lambda job: job.mark_abnormal(job.status_message))
    return move(job_id, TrainingJob.mark_terminated)


def requeue_after_slurm(job: TrainingJob) -> bool:
    with transaction.atomic():
        Worker.objects.filter(job_id=job.pk).delete()
        try:
            job.requeue_after_slurm(job.status_message, job.log_line_count)
        except IllegalTransition:
            return False
    service_line(job.pk, f"Slurm queued its job {job.slurm_job_id} again; attempt {job.attempt} waits for it")
    return True


# The failure card's kinds (jobs.results.failure_card) that say the platform failed the job, not its
# code: a node or worker lost, NCCL or the network, mpirun's daemons not starting, a rank killed by a
# signal nobody sent, a run that ended without an exit status. A Python exception, an exit code the
# program chose, running out of memory or a segfault would only happen again.
RESTARTABLE_KINDS = frozenset({"node_lost", "nccl", "mpirun_launch", "signal", "abnormal"})


def restart_reason(job: TrainingJob) -> str:
    """Why this failed attempt is run again ("" when it is not: no restarts left, or not a restartable failure)."""
    if job.status != JobStatus.RUNNING or job.restart_count >= job.max_restarts:
        return ""
    kind = (job.failure or {}).get("kind", "")
    return (job.failure.get("title") or kind) if kind in RESTARTABLE_KINDS else ""


def restart(job_id: int) -> bool:
    """Queue a failed attempt again, in place (same job, same log), when its failure allows; True if queued."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        reason = restart_reason(job)
        if not reason:
            return False
        # The attempt's workers go with it; the nodes it left unclean are out of service, so the next
        # attempt gets healthy ones.
        Worker.objects.filter(job_id=job_id).delete()
        last_seq = job.log_line_count
        try:
            job.requeue_for_restart(reason, last_seq)
        except IllegalTransition:
            return False
        JobEvent.objects.create(job_id=job_id, kind="restarted",
                                message=f"Attempt {job.attempt - 1} failed ({reason}); attempt {job.attempt} queued")
    service_line(job_id, f"Auto restart: attempt {job.attempt} of {job.max_restarts + 1} queued after: {reason}")
    return True
