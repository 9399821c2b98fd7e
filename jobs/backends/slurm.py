"""A Slurm pool: Slurm allocates, the console launches.

A queued job of a Slurm pool becomes a Slurm batch job (jobs.slurm.batch) that holds its nodes. Once Slurm
runs it, the nodes it gave become the job's workers (in Slurm's order) and the run goes on as on the
console's own pools. While the job runs, Slurm's view is looked at every few seconds (the beat's
`watch_slurm_jobs`): a cancel, a time limit, a preemption, a lost node or a job Slurm no longer knows stops the
console's job, saying which, and jobs.runtime.ending decides its end from what Slurm did. When the console's
job has ended, its Slurm job is told how (completed, failed, or cancelled for a stop), and slurmdbd's
accounting is kept with it. Slurm jobs named for the console's jobs that nothing holds any more are
cancelled, so no node stays allocated.

Slurm unreachable or a token refused: the pool says so (its slurm_status), queued jobs keep waiting with the
reason said, running ones go on, and everything resumes at the next look once Slurm answers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import jwt
from django.conf import settings
from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone

from jobs import allocation
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
    ResourcePool,
    StopReason,
    TrainingJob,
)
from jobs.slurm.batch import (
    COMPLETED_SIGNAL,
    FAILED_SIGNAL,
    HOLDER_SCRIPT,
    JOB_NAME_PREFIX,
    STEP_END_SECONDS,
    STEP_SCRIPT,
    PoolValues,
    batch_request,
)
from jobs.slurm.rest import Credentials, JobRecord, SlurmAuthRefused, SlurmError, SlurmRest, SlurmUnreachable
from jobs.slurm.states import (
    Phase,
    allocated_nodes,
    phase_of,
    preemption_ends_at,
    reason_words,
    time_limit_ends_at,
    time_limit_near,
)

logger = logging.getLogger(__name__)

# Tokens the console makes from a pool's key live this long: a leaked one is soon worthless.
TOKEN_LIFESPAN_S = 600
# How often the capacity page's view of a Slurm pool (its nodes, its accounts' shares and usage) is renewed,
# and how far back the accounts' usage is summed.
SNAPSHOT_EVERY = timedelta(seconds=30)
USAGE_DAYS = 7
# How long after a job's end slurmdbd's record of it is still looked for.
ACCOUNTING_WINDOW = timedelta(minutes=10)


def credentials_for(pool: ResourcePool) -> Credentials:
    key = pool.slurm_jwt_key
    if key:
        try:
            secret = base64.b64decode(key, validate=True)
        except (ValueError, binascii.Error) as error:
            raise SlurmError(f"pool {pool.name}: its JWT key is not base64 ({error})") from error
        now = int(time.time())
        token = jwt.encode({"sun": pool.slurm_user, "iat": now, "exp": now + TOKEN_LIFESPAN_S}, secret,
                           algorithm="HS256")
        return Credentials(pool.slurm_user, token)
    return Credentials(pool.slurm_user, pool.slurm_token)


def client_for(pool: ResourcePool) -> SlurmRest:
    return SlurmRest(pool.slurm_url, credentials_for(pool))


def note_pool(pool: ResourcePool, status: str) -> None:
    ResourcePool.objects.filter(pk=pool.pk).update(slurm_status=status, slurm_checked_at=timezone.now())


def check_pool(pool_id: int) -> str:
    """Ask the pool's slurmrestd what it is; what it said (or why it could not) is kept on the pool."""
    pool = ResourcePool.objects.get(pk=pool_id)
    try:
        status = f"reachable: Slurm {client_for(pool).check_version()}, REST API v0.0.38"
    except SlurmError as error:
        status = str(error)
    note_pool(pool, status)
    return status


def _say_slurm(job: TrainingJob, state: str, reason: str) -> None:
    if (job.slurm_state, job.slurm_reason) != (state, reason[:256]):
        TrainingJob.objects.filter(pk=job.pk).update(slurm_state=state, slurm_reason=reason[:256])
        job.slurm_state, job.slurm_reason = state, reason[:256]


# What makes a pool's whole pass stop: Slurm is not there to ask, or does not take the pool's credentials.
# Any other refusal is about one job, which is told so, and the pass goes on with the others.
POOL_WIDE = (SlurmUnreachable, SlurmAuthRefused)
# One pass per pool at a time (beat, wake-ups and run ends all dispatch, on a worker of many threads); a pass
# that died holds the lock no longer than this.
PASS_LOCK_SECONDS = 60
# How far slurmctld's clock may be behind the console's.
CLOCK_SKEW_S = 5


@contextmanager
def pool_pass(pool: ResourcePool, phase: str) -> Iterator[bool]:
    """Run one pass of a pool (its dispatch, its watch, its release), alone, and keep any failure of it to it:
    one pool's trouble never stops the others' passes."""
    key = f"console:slurm-pass:{phase}:{pool.pk}"
    if not cache.add(key, 1, PASS_LOCK_SECONDS):
        yield False
        return
    try:
        yield True
    except POOL_WIDE as error:
        note_pool(pool, str(error))
    except SlurmError as error:
        logger.warning("Slurm pool %s, %s: %s", pool.name, phase, error)
    except Exception:  # anything else (an answer of an unexpected shape, a secret that cannot be opened)
        logger.exception("Slurm pool %s, %s failed", pool.name, phase)
        note_pool(pool, f"the console could not {phase} this pool's jobs; its log says why")
    finally:
        cache.delete(key)


class SlurmPools:
    """The Backend of Slurm pools (see jobs.backends)."""

    def dispatch(self) -> list[int]:
        started: list[int] = []
        queued = TrainingJob.objects.filter(status=JobStatus.PENDING, pool__backend=ResourcePool.Backend.SLURM)
        for pool, jobs in _by_pool(queued.select_related("pool", "spec", "engine_version", "code_dir")):
            with pool_pass(pool, "dispatch") as mine:
                if not mine:
                    continue
                try:
                    rest = client_for(pool)
                    unsubmitted = [job for job in jobs if job.slurm_job_id is None]
                    live = live_console_jobs(rest, pool) if unsubmitted else {}
                    for job in jobs:
                        if job.slurm_job_id is None:
                            submit_or_refuse(rest, job, lost_submission(job, live))
                        elif look_at_queued(rest, job):
                            started.append(job.pk)
                except POOL_WIDE as error:
                    for job in jobs:
                        _say_slurm(job, job.slurm_state, f"Slurm cannot be reached ({error}); the job stays queued")
                    raise
        return started

    def watch(self) -> list[int]:
        stopping: list[int] = []
        held = TrainingJob.objects.filter(status__in=(JobStatus.CREATING, JobStatus.RUNNING),
                                          pool__backend=ResourcePool.Backend.SLURM, slurm_job_id__isnull=False)
        for pool, jobs in _by_pool(held.select_related("pool")):
            # Running jobs go on when Slurm is away: its silence says nothing about their nodes.
            with pool_pass(pool, "watch") as mine:
                if mine:
                    rest = client_for(pool)
                    stopping += [job.pk for job in jobs if look_at_running(rest, job)]
        return stopping

    def release(self) -> None:
        ended = TrainingJob.objects.filter(status__in=FINAL_STATES, pool__backend=ResourcePool.Backend.SLURM,
                                           slurm_job_id__isnull=False)
        unreleased = ended.filter(slurm_released=False)
        unaccounted = ended.filter(slurm_released=True, slurm_accounting={},
                                   ended_at__gte=timezone.now() - ACCOUNTING_WINDOW)
        pending = dict(_by_pool((unreleased | unaccounted).select_related("pool")))
        for pool in ResourcePool.objects.filter(backend=ResourcePool.Backend.SLURM):
            with pool_pass(pool, "release") as mine:
                if not mine:
                    continue
                rest = client_for(pool)
                for job in pending.get(pool, []):
                    release_one(rest, job)
                if pool.slurm_snapshot_at is None or timezone.now() - pool.slurm_snapshot_at >= SNAPSHOT_EVERY:
                    # The sweep lists every job of the cluster: every snapshot, not every pass.
                    cancel_strays(rest, pool)
                    take_snapshot(rest, pool)


SLURM = SlurmPools()


def release_one(rest: SlurmRest, job: TrainingJob) -> None:
    """Give back one ended job's allocation, then keep its accounting: either failing is this job's alone."""
    try:
        if not job.slurm_released:
            give_back(rest, job)
    except POOL_WIDE:
        raise
    except SlurmError as error:
        logger.warning("job %s: giving back Slurm job %s: %s", job.pk, job.slurm_job_id, error)
        return
    try:
        keep_accounting(rest, job)
    except POOL_WIDE:
        raise
    except SlurmError as error:  # slurmdbd away, or a REST server without its plugin: the page waits for it
        logger.info("job %s: no accounting yet for Slurm job %s: %s", job.pk, job.slurm_job_id, error)


def _by_pool(jobs: Any) -> list[tuple[ResourcePool, list[TrainingJob]]]:
    grouped: dict[int, tuple[ResourcePool, list[TrainingJob]]] = {}
    for job in jobs.order_by("created_at", "id"):
        grouped.setdefault(job.pool_id, (job.pool, []))[1].append(job)
    return list(grouped.values())


def console_job_name(job_id: int) -> str:
    """The name of a console job's Slurm job: this console's own prefix (made from its secret key, so two
    consoles on one cluster, and a user who names a job alike, never pass for each other) and the job's id."""
    return f"{JOB_NAME_PREFIX}{console_tag()}-{job_id}"


def console_tag() -> str:
    return hashlib.sha256(b"slurm-job-name:" + settings.SECRET_KEY.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class LiveSlurmJob:
    slurm_id: int
    submitted: int  # seconds since the epoch, as slurmctld says


def live_console_jobs(rest: SlurmRest, pool: ResourcePool) -> dict[int, list[LiveSlurmJob]]:
    """The Slurm jobs of this console that the pool's Slurm user holds, waiting or running, by the console job
    they are named for (several, where a job's id was used again after its row was deleted)."""
    named_for = re.compile(re.escape(f"{JOB_NAME_PREFIX}{console_tag()}-") + r"(\d+)")
    live: dict[int, list[LiveSlurmJob]] = {}
    for record in rest.jobs():
        named = named_for.fullmatch(str(record.get("name") or ""))
        if named and record.get("user_name") == pool.slurm_user and \
                phase_of(str(record.get("job_state") or "")) in (Phase.WAITING, Phase.RUNNING):
            live.setdefault(int(named.group(1)), []).append(
                LiveSlurmJob(int(record["job_id"]), int(record.get("submit_time") or 0)))
    return live


def lost_submission(job: TrainingJob, live: dict[int, list[LiveSlurmJob]]) -> int | None:
    """A Slurm job this job's submission made whose answer was lost: named for it and submitted after it was
    created (one named for an earlier job of the same id, whose row was deleted, is not its own)."""
    created = job.created_at.timestamp() - CLOCK_SKEW_S
    own = [entry.slurm_id for entry in live.get(job.pk, []) if entry.submitted >= created]
    return min(own) if own else None


def notice_seconds(job: TrainingJob) -> int:
    """How long before its Slurm time limit a job is stopped: its checkpoint grace, the most a stop's last upload
    may take, and a margin for the teardown (jobs.submission.forms refuses a limit that leaves no time past it)."""
    return stop_before_limit_seconds(job.checkpoint_grace_seconds)


def stop_before_limit_seconds(grace_seconds: int) -> int:
    return grace_seconds + settings.OUTPUT_FINAL_SYNC_SECONDS + settings.SLURM_NOTICE_MARGIN_SECONDS


def submit_or_refuse(rest: SlurmRest, job: TrainingJob, already: int | None) -> None:
    """Submit; a submission Slurm refuses (a time limit over the partition's, an account the user is not in)
    fails this job with Slurm's own words, and the pool goes on with the others."""
    try:
        submit(rest, job, already)
    except POOL_WIDE:
        raise
    except SlurmError as error:
        _end_queued(job, JobStatus.FAILED, f"Slurm refused the job: {error}")


def submit(rest: SlurmRest, job: TrainingJob, already: int | None) -> None:
    """Submit the job's batch job, once: `already`, a Slurm job named for it (a submission whose answer was
    lost), is taken as its own."""
    pool = job.pool
    assert pool is not None
    slurm_id = already
    if slurm_id is None:
        limit = job.auto_stop_hours * 60 if job.auto_stop_hours else None
        # Without root, the batch job's own step runs the containers in the jobs' folder of the Slurm user.
        rootless = not pool.slurm_root_ssh
        folder = f"{pool.slurm_work_root}/{job.dns_name}" if rootless else ""
        slurm_id = rest.submit(batch_request(job.launch_values(), PoolValues(pool.slurm_partition),
                                             STEP_SCRIPT if rootless else HOLDER_SCRIPT,
                                             name=console_job_name(job.pk), account=pool.slurm_account,
                                             time_limit_minutes=limit, job_folder=folder))
    claimed = TrainingJob.objects.filter(pk=job.pk, status=JobStatus.PENDING, slurm_job_id__isnull=True).update(
        slurm_job_id=slurm_id, slurm_state="PENDING", slurm_reason=reason_words(None))
    if not claimed:
        # Stopped meanwhile (the allocation must not wait for nobody), or another pass claimed it first: that
        # pass's Slurm job is the job's, and only one that is not is cancelled.
        held = TrainingJob.objects.filter(pk=job.pk).values_list("slurm_job_id", flat=True).first()
        if held != slurm_id:
            rest.cancel(slurm_id)
        return
    job.slurm_job_id = slurm_id
    account = f", account {pool.slurm_account}" if pool.slurm_account else ""
    JobEvent.objects.create(job_id=job.pk, kind="slurm",
                            message=f"Submitted to Slurm as job {slurm_id} (partition {pool.slurm_partition}{account})")
    service_line(job.pk, f"Submitted to Slurm as job {slurm_id}; Slurm decides when it runs")


def look_at_queued(rest: SlurmRest, job: TrainingJob) -> bool:
    """A queued job's Slurm job: still waiting (say why), running (its nodes become the job's workers: True),
    or ended before it ran."""
    assert job.slurm_job_id is not None
    record = rest.job(job.slurm_job_id)
    if record is None:
        _end_queued(job, JobStatus.ABNORMAL, f"Slurm no longer knows its job {job.slurm_job_id}")
        return False
    phase = phase_of(record["job_state"])
    if phase is Phase.WAITING:
        _say_slurm(job, record["job_state"], reason_words(record.get("state_reason"), record.get("state_description")))
        return False
    if phase is Phase.RUNNING and (preemption_ends_at(record) is not None or _state(record) == "COMPLETING"):
        # The attempt the console stopped for a preemption: Slurm holds its nodes until the grace is over, then
        # queues it again. They are not this attempt's to take.
        _say_slurm(job, job.slurm_state, "Slurm is taking its nodes back (a preemption) and will queue it again")
        return False
    if phase is Phase.RUNNING:
        return _take_nodes(rest, job, record)
    if phase is Phase.PREEMPTED:
        # Slurm ended it for a preemption instead of queueing it again (the QOS's PreemptMode cancels): the next
        # attempt is a new Slurm job, submitted at the next pass.
        TrainingJob.objects.filter(pk=job.pk, slurm_job_id=job.slurm_job_id).update(
            slurm_job_id=None, slurm_state="", slurm_reason="")
        return False
    words = {Phase.CANCELLED: f"Slurm cancelled its job {job.slurm_job_id} before it ran",
             Phase.TIME_LIMIT: f"Slurm's time limit ended its job {job.slurm_job_id} before it ran"}.get(
        phase, f"its Slurm job {job.slurm_job_id} ended {record['job_state']} before it ran")
    _say_slurm(job, record["job_state"], words)
    _end_queued(job, JobStatus.TERMINATED if phase is Phase.CANCELLED else JobStatus.FAILED, words)
    return False


def _end_queued(job: TrainingJob, status: str, message: str) -> None:
    try:
        job.transition(status, message, **({"stop_reason": StopReason.SLURM} if status == JobStatus.TERMINATED else {}))
    except IllegalTransition:
        return
    service_line(job.pk, message)


def _take_nodes(rest: SlurmRest, job: TrainingJob, record: JobRecord) -> bool:
    names = allocated_nodes(record)
    nodes = dict(Node.objects.filter(pool_id=job.pool_id, name__in=names).values_list("name", "pk"))
    missing = [name for name in names if name not in nodes]
    if missing or not names:
        message = (f"Slurm gave node(s) {', '.join(missing)}, which are not registered in pool {job.pool}: an "
                   "administrator adds them (with the console's SSH key) or takes them out of the partition"
                   if missing else f"Slurm ran job {job.slurm_job_id} on no node the console can read")
        assert job.slurm_job_id is not None
        rest.cancel(job.slurm_job_id)
        _end_queued(job, JobStatus.FAILED, message)
        return False
    _say_slurm(job, record["job_state"], f"running on {', '.join(names)}")
    TrainingJob.objects.filter(pk=job.pk).update(slurm_restarts=int(record.get("restart_cnt") or 0))
    outcome = allocation.assign(job, [nodes[name] for name in names])
    if outcome is not allocation.Outcome.ALLOCATED:
        # A node still held by the console's last run on it: taken at the next look, once it is released.
        return False
    service_line(job.pk, f"Slurm runs job {job.slurm_job_id} on {', '.join(names)}: preparing the containers")
    return True


def look_at_running(rest: SlurmRest, job: TrainingJob) -> bool:
    """A running job's Slurm job: True when Slurm ended it, and the console's job is now stopping."""
    assert job.slurm_job_id is not None
    record = rest.job(job.slurm_job_id)
    reason: str
    if record is None:
        state, reason, message = SLURM_VANISHED, StopReason.SLURM, f"Slurm no longer knows its job {job.slurm_job_id}"
    else:
        phase = phase_of(record["job_state"])
        if phase is Phase.RUNNING and int(record.get("restart_cnt") or 0) > job.slurm_restarts:
            # Requeued and running again since the console took its nodes: they may be other nodes now.
            phase = Phase.WAITING
        elif phase is Phase.RUNNING and time_limit_near(
                time_limit_ends_at(record.get("start_time"), record.get("time_limit")), notice_seconds(job), time.time()):
            # Slurm would kill the job at its limit, its ranks unwarned: the console stops it first, as an auto
            # stop, with the notice and grace any stop gives. (Slurm's own --signal cannot reach the batch script
            # of a job submitted through slurmrestd: 22.05 takes its "B:" only from sbatch.)
            reason, message = StopReason.AUTO_STOP, f"Stopped by auto stop: Slurm's time limit for job {job.slurm_job_id} is near"
            _say_slurm(job, record["job_state"], f"the time limit of Slurm job {job.slurm_job_id} is near")
            return _begin_stop(job, reason, message)
        elif phase is Phase.RUNNING and (ends_at := preemption_ends_at(record)) is not None:
            # Slurm preempts the job at the end of its grace: the console stops it now, so that its ranks get the
            # notice and as much of their grace as fits before the nodes are taken back.
            left = max(0.0, ends_at - time.time() - CLOCK_SKEW_S)
            message = (f"Slurm preempted job {job.slurm_job_id} for a higher-priority job: it takes the nodes back in "
                       f"{int(left)} s")
            _say_slurm(job, SLURM_PREEMPTING, message)
            return _begin_stop(job, StopReason.SLURM, message, ends_by=timezone.now() + timedelta(seconds=left))
        elif phase is Phase.RUNNING:
            return False
        state = record["job_state"]
        reason, message = _stop_words(phase, job.slurm_job_id)
        if phase is Phase.WAITING:  # Slurm requeued it (a preemption, a lost node) before the console looked
            state = SLURM_REQUEUED
    _say_slurm(job, state, message)
    return _begin_stop(job, reason, message)


def _state(record: JobRecord) -> str:
    return (str(record.get("job_state") or "").split() or [""])[0]


def _begin_stop(job: TrainingJob, reason: str, message: str, ends_by: datetime | None = None) -> bool:
    try:
        job.begin_console_stop(reason, message, ends_by)
    except IllegalTransition:
        return False
    service_line(job.pk, f"{message}: ending the containers on every node")
    return True


def _stop_words(phase: Phase, slurm_id: int) -> tuple[str, str]:
    if phase is Phase.TIME_LIMIT:
        return StopReason.AUTO_STOP, f"Stopped by auto stop: Slurm's time limit for job {slurm_id} ran out"
    if phase is Phase.PREEMPTED or phase is Phase.WAITING:
        return StopReason.SLURM, f"Slurm preempted job {slurm_id} for a higher-priority job"
    if phase is Phase.NODE_LOST:
        return StopReason.SLURM, f"Slurm lost a node of job {slurm_id} (NODE_FAIL)"
    if phase is Phase.CANCELLED:
        return StopReason.SLURM, f"Slurm cancelled job {slurm_id} (scancel, from outside the console)"
    return StopReason.SLURM, f"Slurm ended job {slurm_id} ({phase.value})"


def give_back(rest: SlurmRest, job: TrainingJob) -> None:
    """End the Slurm job of a job that ended, the way the console's job ended."""
    assert job.slurm_job_id is not None
    record = rest.job(job.slurm_job_id)
    phase = phase_of(record["job_state"]) if record is not None else None
    if phase is Phase.WAITING:
        rest.cancel(job.slurm_job_id)  # requeued, or never ran: no script to tell how it ended
    elif phase is Phase.RUNNING:
        if job.status == JobStatus.COMPLETED:
            rest.signal(job.slurm_job_id, COMPLETED_SIGNAL)
        elif job.status == JobStatus.TERMINATED:
            rest.cancel(job.slurm_job_id)
        else:
            rest.signal(job.slurm_job_id, FAILED_SIGNAL)
    TrainingJob.objects.filter(pk=job.pk).update(slurm_released=True)
    job.slurm_released = True


def keep_accounting(rest: SlurmRest, job: TrainingJob) -> None:
    assert job.slurm_job_id is not None
    record = rest.accounting(job.slurm_job_id)
    state = ((record or {}).get("state") or {}).get("current", "")
    if record is None or state in ("", "PENDING", "RUNNING", "REQUEUED"):
        return  # slurmdbd has not heard of its end yet: the next pass looks again
    # Slurm's last word on the job replaces what the watch saw while it ran.
    TrainingJob.objects.filter(pk=job.pk).update(slurm_accounting=accounting_summary(record), slurm_state=state,
                                                 slurm_reason="")


def accounting_summary(record: dict[str, Any]) -> dict[str, Any]:
    """What the job page shows of slurmdbd's record: account, QOS, elapsed, CPU and GPU hours."""
    times = record.get("time") or {}
    elapsed = int(times.get("elapsed") or 0)
    allocated = {tres.get("type") + (f"/{tres['name']}" if tres.get("name") else ""): int(tres.get("count") or 0)
                 for tres in (record.get("tres") or {}).get("allocated") or [] if tres.get("type")}
    used = times.get("total") or {}
    return {
        "account": record.get("account") or "",
        "qos": record.get("qos") or "",
        "state": (record.get("state") or {}).get("current", ""),
        "elapsed_seconds": elapsed,
        "nodes": allocated.get("node", 0),
        "cpus": allocated.get("cpu", 0),
        "gpus": allocated.get("gres/gpu", 0),
        "cpu_hours": round(allocated.get("cpu", 0) * elapsed / 3600, 3),
        "gpu_hours": round(allocated.get("gres/gpu", 0) * elapsed / 3600, 3),
        "cpu_time_used_seconds": int(used.get("seconds") or 0),
    }


# How long past STEP_END_SECONDS a Slurm job told how its job ended may take to end (its script's exit, slurmctld).
ENDING_MARGIN_SECONDS = 40


def cancel_strays(rest: SlurmRest, pool: ResourcePool) -> None:
    """Cancel the pool's Slurm jobs named for a console job that no longer holds them (ended, deleted, or holding
    another): what a crash between a submission and its record could leave holding nodes."""
    live = live_console_jobs(rest, pool)
    if not live:
        return
    # Held by a job of any pool: two pools may share a partition (to charge two accounts, say). A job that ended
    # holds its Slurm job until the console has told Slurm how it ended, and a while after (the batch script waits
    # for its step first): a cancel then would make Slurm's record of a completed job CANCELLED.
    ending_since = timezone.now() - timedelta(seconds=STEP_END_SECONDS + ENDING_MARGIN_SECONDS)
    held = set(TrainingJob.objects.filter(pk__in=live)
               .filter(~Q(status__in=FINAL_STATES) | Q(slurm_released=False) | Q(ended_at__gte=ending_since))
               .values_list("pk", "slurm_job_id"))
    # A job being submitted right now has no Slurm id yet: the next dispatch takes this one as its own.
    unsubmitted = set(TrainingJob.objects.filter(pk__in=live, status=JobStatus.PENDING,
                                                 slurm_job_id__isnull=True).values_list("pk", flat=True))
    for job_id, entries in live.items():
        for entry in entries:
            if (job_id, entry.slurm_id) not in held and job_id not in unsubmitted:
                logger.warning("cancelling Slurm job %s: console job %s no longer holds it", entry.slurm_id, job_id)
                rest.cancel(entry.slurm_id)


def take_snapshot(rest: SlurmRest, pool: ResourcePool) -> None:
    """Keep on the pool what Slurm says of its partition's nodes and of its accounts, for the capacity page."""
    nodes = [{"name": node["name"], "state": node["state"], "reason": node.get("reason") or "",
              "cpus": node.get("cpus", 0), "alloc_cpus": node.get("alloc_cpus", 0),
              "memory_mb": node.get("real_memory", 0), "gres": node.get("gres") or ""}
             for node in rest.nodes() if pool.slurm_partition in (node.get("partitions") or [pool.slurm_partition])]
    since = timezone.localdate() - timedelta(days=USAGE_DAYS)
    accounts = account_usage(rest.associations(), rest.accounted_jobs(since))
    ResourcePool.objects.filter(pk=pool.pk).update(slurm_nodes=nodes, slurm_accounts=accounts,
                                                   slurm_snapshot_at=timezone.now())


def account_usage(associations: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each account's fair share as sshare shows it (raw shares, normalised among its siblings) beside its use
    of the cluster over the last days (CPU and GPU hours of its jobs, and its part of all use)."""
    accounts = [association for association in associations if not association.get("user")]
    siblings: dict[str, int] = {}
    for account in accounts:
        siblings[account.get("parent_account") or ""] = siblings.get(account.get("parent_account") or "", 0) + \
            int(account.get("shares_raw") or 0)
    used: dict[str, dict[str, float]] = {}
    for job in jobs:
        summary = accounting_summary(job)
        entry = used.setdefault(summary["account"], {"cpu_hours": 0.0, "gpu_hours": 0.0, "jobs": 0})
        entry["cpu_hours"] += summary["cpu_hours"]
        entry["gpu_hours"] += summary["gpu_hours"]
        entry["jobs"] += 1
    total = sum(entry["cpu_hours"] for entry in used.values()) or 1.0
    rows = []
    for account in sorted(accounts, key=lambda account: account["account"]):
        name, parent = account["account"], account.get("parent_account") or ""
        shares = int(account.get("shares_raw") or 0)
        usage = used.get(name, {"cpu_hours": 0.0, "gpu_hours": 0.0, "jobs": 0})
        rows.append({"account": name, "parent": parent, "shares": shares,
                     "norm_shares": round(shares / siblings[parent], 3) if siblings[parent] else 0.0,
                     "cpu_hours": round(usage["cpu_hours"], 3), "gpu_hours": round(usage["gpu_hours"], 3),
                     "jobs": int(usage["jobs"]), "usage_share": round(usage["cpu_hours"] / total, 3)})
    return rows
