"""What a job's checkpoints are worth: each one recorded as it lands in the store, the notice before a stop,
and the work each attempt lost (the time since its last checkpoint, in node-hours and GPU-hours).

The runtime (jobs.runtime.checkpoints) reads the program's manifest and uploads what it names; the records
are made here, so the run, a stop from another process and the reaper keep them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, Min, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from jobs.launch.checkpoint_contract import CheckpointClaim
from jobs.logs.store import readable_size, service_line
from jobs.models import Attempt, Checkpoint, JobEvent, MetricPoint, TrainingJob

# How many warnings about untrusted manifests one attempt keeps on its page (a program rewriting a bad one
# each second must not fill the timeline).
MAX_WARNINGS_AN_ATTEMPT = 20


def record_checkpoint(job_id: int, claim: CheckpointClaim, url: str, size_bytes: int, file_count: int) -> Checkpoint:
    """Keep a checkpoint that is complete in the store; the timeline says when a notice was answered."""
    job = TrainingJob.objects.only("restart_count", "notice_sent_at").get(pk=job_id)
    now = timezone.now()
    after = (now - job.notice_sent_at).total_seconds() if job.notice_sent_at else None
    checkpoint = Checkpoint.objects.create(job_id=job_id, attempt=job.attempt, step=claim.step, path=claim.path,
                                           url=url, size_bytes=size_bytes, file_count=file_count, saved_at=now,
                                           program_time=claim.time, after_notice_seconds=after)
    # The newest CHECKPOINTS_KEPT are the record: the ones a job resumes from and measures lost work against
    # are the newest, and a program saving every few seconds for weeks would otherwise grow the table for ever.
    stale = Checkpoint.objects.filter(job_id=job_id).values_list("id", flat=True)[settings.CHECKPOINTS_KEPT:]
    Checkpoint.objects.filter(id__in=list(stale)).delete()
    words = f"checkpoint at step {claim.step:,} ({claim.path}, {readable_size(size_bytes)}) saved"
    words += f" {after:.0f} s after the notice" if after is not None else " in the store"
    JobEvent.objects.create(job_id=job_id, kind="checkpoint", message=words[0].upper() + words[1:])
    service_line(job_id, words[0].upper() + words[1:])
    return checkpoint


def last_claim(job_id: int) -> CheckpointClaim | None:
    """The claim of the newest checkpoint the job knows (its own, or the one it resumes from): a manifest that
    still names it (brought back with train_url, or read again by a run taken up again) is not a new one."""
    last = TrainingJob.objects.get(pk=job_id).resume_checkpoint()
    return CheckpointClaim(last.step, last.path, last.program_time) if last else None


def warn_checkpoint(job_id: int, reason: str) -> None:
    """A manifest the console does not trust: said on the page (a few times an attempt), never resumed from."""
    since = JobEvent.objects.filter(job_id=job_id, kind="state:Running").order_by("-id").values_list("at", flat=True).first()
    warnings = JobEvent.objects.filter(job_id=job_id, kind="checkpoint-ignored")
    if since is not None:
        warnings = warnings.filter(at__gte=since)
    if warnings.count() >= MAX_WARNINGS_AN_ATTEMPT:
        return
    JobEvent.objects.create(job_id=job_id, kind="checkpoint-ignored", message=f"Checkpoint ignored: {reason}")
    service_line(job_id, f"Checkpoint ignored: {reason}")


@dataclass(frozen=True)
class Notice:
    """An attempt's notice before a stop: when it went out, whether this caller sends it, and the grace it gives
    (0: none, there is no time for one; nothing was claimed)."""

    sent_at: datetime
    ours: bool
    grace: int


def claim_notice(job_id: int, job_grace: int, teardown_seconds: float) -> Notice:
    """When this attempt's notice went out, whether it is this caller's to send (once an attempt, whichever
    process, a run taken up again by another, asks), and its grace: the job's, cut short where its nodes are
    taken back sooner (TrainingJob.notice_ends_by)."""
    now = timezone.now()
    ends_by = TrainingJob.objects.values_list("notice_ends_by", flat=True).get(pk=job_id)
    if notice_grace(job_grace, now, ends_by, teardown_seconds) <= 0:
        return Notice(now, False, 0)
    if TrainingJob.objects.filter(pk=job_id, notice_sent_at__isnull=True).update(notice_sent_at=now):
        return Notice(now, True, notice_grace(job_grace, now, ends_by, teardown_seconds))
    sent_at = TrainingJob.objects.values_list("notice_sent_at", flat=True).get(pk=job_id) or now
    return Notice(sent_at, False, notice_grace(job_grace, sent_at, ends_by, teardown_seconds))


def notice_grace(job_grace: int, sent_at: datetime, ends_by: datetime | None, teardown_seconds: float) -> int:
    """The grace a notice gives: the job's own, cut short where its nodes are taken back before the grace and
    the teardown after it would be over (never below 0)."""
    if ends_by is None:
        return job_grace
    room = (ends_by - sent_at).total_seconds() - teardown_seconds
    return max(0, min(job_grace, int(room)))


def note_notice(job_id: int, message: str) -> None:
    """The notice went out: said in the timeline and the log."""
    JobEvent.objects.create(job_id=job_id, kind="notice", message=message)
    service_line(job_id, message)


@dataclass(frozen=True)
class LostWork:
    seconds: float
    node_hours: float
    gpu_hours: float


def lost_work(started_at: datetime, ended_at: datetime, last_checkpoint_at: datetime | None, node_count: int,
              gpus_per_node: int) -> LostWork:
    """The work an attempt lost: from its last checkpoint (its start, without one) to its end, on all its nodes."""
    since = max(last_checkpoint_at, started_at) if last_checkpoint_at else started_at
    seconds = max((ended_at - since).total_seconds(), 0.0)
    return LostWork(seconds, seconds * node_count / 3600, seconds * node_count * gpus_per_node / 3600)


def close_attempt(job_id: int, ended_as: str, completed: bool = False) -> Attempt | None:
    """Record the attempt that is ending (once) with the work it lost (none when it completed); None for an
    attempt that never started."""
    job = TrainingJob.objects.select_related("spec").get(pk=job_id)
    if job.started_at is None:
        return None
    now = timezone.now()
    last = job.checkpoints.filter(attempt=job.attempt).order_by("-saved_at").first()
    lost = lost_work(job.started_at, now, last.saved_at if last else None, job.node_count, job.spec.gpu_count)
    if completed:
        lost = LostWork(0.0, 0.0, 0.0)
    # The steps its log showed (the metrics' steps since the attempt's first line).
    first_seq = job.attempt_log_starts[-1] if job.restart_count and job.attempt_log_starts else 0
    steps = MetricPoint.objects.filter(job_id=job_id, seq__gt=first_seq, step__isnull=False).aggregate(
        first=Min("step"), reached=Max("step"))
    lost_steps: int | None = 0 if completed else None
    if steps["reached"] is not None and not completed:
        lost_steps = max(steps["reached"] - (last.step if last else steps["first"] - 1), 0)
    with transaction.atomic():
        attempt, _ = Attempt.objects.get_or_create(job_id=job_id, number=job.attempt, defaults={
            "started_at": job.started_at, "ended_at": now, "ended_as": ended_as[:256], "node_count": job.node_count,
            "gpu_count": job.spec.gpu_count * job.node_count,
            "last_checkpoint_step": last.step if last else None, "last_checkpoint_at": last.saved_at if last else None,
            "lost_seconds": lost.seconds, "lost_steps": lost_steps, "lost_node_hours": lost.node_hours, "lost_gpu_hours": lost.gpu_hours})
    return attempt


def lost_work_words(attempt: Attempt) -> str:
    """'attempt 2 lost 3 min, 0.10 node-h (since its checkpoint at step 1,200)', as the job page says it."""
    if not attempt.lost_seconds and not attempt.lost_node_hours and not attempt.lost_steps:
        return _("attempt %(number)s lost nothing") % {"number": attempt.number}  # it completed
    minutes = attempt.lost_seconds / 60
    span = f"{attempt.lost_seconds:.0f} s" if minutes < 1 else f"{minutes:.0f} min"
    hours = _("%(hours)s node-h") % {"hours": f"{attempt.lost_node_hours:.2f}"}
    if attempt.gpu_count:
        hours += ", " + _("%(hours)s GPU-h") % {"hours": f"{attempt.lost_gpu_hours:.2f}"}
    if attempt.lost_steps is not None:
        hours += ", " + _("%(steps)s steps") % {"steps": f"{attempt.lost_steps:,}"}
    if attempt.last_checkpoint_step is not None:
        since = _("since its checkpoint at step %(step)s") % {"step": f"{attempt.last_checkpoint_step:,}"}
    else:
        since = _("no checkpoint: the whole attempt")
    return _("attempt %(number)s lost %(span)s, %(hours)s (%(since)s)") % {
        "number": attempt.number, "span": span, "hours": hours, "since": since}


def lost_work_totals(group_by: str) -> list[dict[str, object]]:
    """Lost work summed by `group_by` ("job__owner__username" or "job__pool__name"), the largest first."""
    rows = (Attempt.objects.values(group_by)
            .annotate(attempts=Count("id"), seconds=Sum("lost_seconds"), node_hours=Sum("lost_node_hours"),
                      gpu_hours=Sum("lost_gpu_hours"))
            .order_by("-node_hours"))
    return [{"name": row[group_by] or "", "attempts": row["attempts"], "seconds": row["seconds"] or 0.0,
             "node_hours": row["node_hours"] or 0.0, "gpu_hours": row["gpu_hours"] or 0.0} for row in rows]
