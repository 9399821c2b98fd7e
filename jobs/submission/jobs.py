"""Submission and stop: a validated form becomes a queued job, a stop ends one; the queue hears after the commit.

The job pages, the API and the admin all submit and stop through here.
"""

import secrets
from functools import partial

from django.db import IntegrityError, transaction
from django.shortcuts import get_object_or_404
from django.utils import timezone

from jobs.launch.checkpoint_contract import DEFAULT_NOTICE_SIGNAL
from jobs.models import JobEvent, LauncherDefaults, TrainingJob
from jobs.submission import task_queue
from jobs.submission.access import STOP_OTHERS, ensure_may, visible_jobs
from jobs.submission.forms import TrainingJobForm


def sshd_port_for(job_id: int, defaults: LauncherDefaults) -> int:
    """A job's sshd port, drawn at random from the administrator's range: the job's id no longer picks it
    (30000 + id told everyone the port of every job, and MindSpore's scheduler port, this one + 1000).
    Nodes are exclusive to a job, so the port only has to differ from the node's own services."""
    span = max(defaults.sshd_port_max - defaults.sshd_port_min + 1, 1)
    return defaults.sshd_port_min + secrets.randbelow(span)


def job_from_form(form: TrainingJobForm, owner=None) -> TrainingJob:
    """The job a valid form describes, unsaved, with the launcher defaults it will keep."""
    data = form.cleaned_data
    defaults = LauncherDefaults.current()
    return TrainingJob(
        name=data.get("name", ""),
        description=data.get("description", ""),
        owner=owner,
        engine_version=data["engine"],
        code_dir=data["code_dir"],
        boot_file=data["boot_file"],
        parameters=form.job_parameters(),
        env=data.get("env") or {},
        spec=data["spec"],
        pool=data.get("pool"),
        node_count=data["node_count"],
        extra_args=data.get("extra_args", ""),
        auto_stop_hours=data.get("auto_stop_hours"),
        max_restarts=data.get("max_restarts") or 0,
        predownload=bool(data.get("predownload")),
        checkpoint_grace_seconds=data.get("checkpoint_grace_seconds") or 0,
        checkpoint_signal=data.get("checkpoint_signal") or DEFAULT_NOTICE_SIGNAL,
        debug_hold_minutes=data.get("debug_hold_minutes") or 0,
        resume_source_id=data.get("resume_from_job") or None,
        rebuilt_from_id=data.get("rebuilt_from") or None,
        # Only what the user chose: no metrics means the defaults, no watchdog time or action the administrator's,
        # no rank-exit grace the setting's, each read when it is used, so a Rebuild copies the choices and the copy
        # follows the defaults of its own day.
        metric_definitions=data.get("metrics") or [],
        watchdog_seconds=data.get("watchdog_seconds"),
        watchdog_action=data.get("watchdog_action"),
        rank_exit_grace_seconds=data.get("rank_exit_grace_seconds"),
        bind_args=defaults.bind_args,
        x_args=defaults.x_args,
        mca_args=defaults.mca_args,
        tune_prefixes=defaults.tune_prefixes,
        log_cap_bytes=defaults.log_cap_bytes,
        outputs_max_bytes=defaults.outputs_max_bytes,
    )


def submit_job(form: TrainingJobForm, owner) -> TrainingJob:
    return submit_job_once(form, owner, "")[0]


def submit_job_once(form: TrainingJobForm, owner, idempotency_key: str) -> tuple[TrainingJob, bool]:
    """Queue the job a valid form describes; (the job, whether it was created now).

    With an idempotency key, a retry of the same submission (a client that lost the answer, a double
    click) gets the job the first one created, however the two raced.
    """
    if idempotency_key:
        earlier = TrainingJob.objects.filter(owner=owner, idempotency_key=idempotency_key).first()
        if earlier is not None:
            return earlier, False
    job = job_from_form(form, owner)
    job.idempotency_key = idempotency_key
    try:
        with transaction.atomic():
            job.save()
            job.sshd_port = sshd_port_for(job.pk, LauncherDefaults.current())
            job.save(update_fields=["sshd_port"])
            JobEvent.objects.create(job=job, kind="state:Pending", message="Job created, waiting for resources")
            # The queue is in commit order: a submission that commits later queues later, whenever it began.
            # Robust: the job is committed by then, and a database busy again must not turn its 201 into an error
            # (the job then keeps the time it was saved at).
            transaction.on_commit(partial(_stamp_queued, job), robust=True)
            # The broker may be away: the job is kept all the same, and the periodic dispatch queues it.
            transaction.on_commit(task_queue.wake_dispatcher)
    except IntegrityError:
        if not idempotency_key:
            raise
        return TrainingJob.objects.get(owner=owner, idempotency_key=idempotency_key), False
    return job, True


def _stamp_queued(job: TrainingJob) -> None:
    now = timezone.now()
    TrainingJob.objects.filter(pk=job.pk).update(created_at=now)
    job.created_at = now


def stop_event_message(username: str) -> str:
    """Who asked for a stop, as the timeline keeps it (in English, like the console's other events)."""
    return f"Stop requested by {username}"


def request_stop(job: TrainingJob, by: str = "") -> None:
    """Stop a job: a queued one ends at once, a live one gets its containers ended by a worker.

    With the broker away the stop still happens: the job's run sees it Terminating and ends its containers.
    `by`: who asked; the stop's own change of state then says so, so that one stop is one timeline entry.
    """
    finished = job.terminate()
    if by:
        sign_stop(job, by)
    if finished:
        transaction.on_commit(task_queue.wake_dispatcher)
    else:
        transaction.on_commit(partial(task_queue.queue_stop, job.pk))


def sign_stop(job: TrainingJob, by: str) -> None:
    """Put who asked on the event of the state the stop just moved the job to (Terminating, or Terminated for a
    queued job) rather than beside it: a second event would show the same stop twice on the timeline."""
    event = job.events.filter(kind=f"state:{job.status}").order_by("-id").first()
    if event is not None:
        event.message = stop_event_message(by)
        event.save(update_fields=["message"])


def stop_visible_job(user, pk: int) -> TrainingJob:
    """Stop one of the jobs `user` may see: Http404 for an unseen one, PermissionDenied for another's without
    the permission, IllegalTransition when it cannot stop now."""
    with transaction.atomic():
        job = get_object_or_404(visible_jobs(user), pk=pk)
        ensure_may(user, job, STOP_OTHERS)
        request_stop(job, by=user.get_username())
    return job
