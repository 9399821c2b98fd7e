"""Who may open a terminal in a job's container, and when: the job's owner only (an administrator who may see
every job may not type in one: what is typed there runs as the job's user), while the job has its containers
(running, or a failed job held for a look inside), within SHELLS_PER_USER open at once."""

from dataclasses import dataclass

import redis
from django.conf import settings

from jobs import shell_channel
from jobs.models import TrainingJob
from jobs.submission import task_queue


@dataclass
class ShellRefused(Exception):
    status: int
    field: str
    message: str


def open_shell(user, job: TrainingJob, worker_index: int, columns: int, rows: int) -> shell_channel.ShellSession:
    """A new session in the job's worker, its relay queued; ShellRefused says why not."""
    if job.owner_id != user.pk:
        raise ShellRefused(403, "detail", "Only the job's owner may open a terminal in its containers.")
    if not (job.status == "Running" or job.is_held_for_debugging):
        raise ShellRefused(409, "status", f"The job is {job.status}: a terminal opens only while the job runs, or "
                                          "while a failed job's containers are held for a look inside.")
    if not job.workers.filter(index=worker_index).exclude(container_name="").exists():
        raise ShellRefused(400, "worker", f"The job has no worker-{worker_index} with a container.")
    try:
        session = shell_channel.open_session(job.pk, worker_index, user.pk, user.get_username(), columns, rows,
                                             most=settings.SHELLS_PER_USER)
    except shell_channel.TooManySessions:
        raise ShellRefused(429, "detail", f"{settings.SHELLS_PER_USER} terminals are open already, the most one "
                                          "user may hold: close one first.") from None
    except redis.RedisError as error:
        raise ShellRefused(503, "detail", "The console's message broker does not answer: try again shortly.") from error
    if not task_queue.open_shell(session.id, expires=settings.SHELL_START_SECONDS):
        shell_channel.forget(session)
        raise ShellRefused(503, "detail", "The console's workers could not be asked to open the terminal: try again "
                                          "shortly.")
    return session


def own_session(user, job: TrainingJob, session_id: str) -> shell_channel.ShellSession | None:
    """The session, when it is this user's in this job (else None: the API answers 404)."""
    try:
        session = shell_channel.session(session_id)
    except redis.RedisError:
        return None
    if session is None or session.user_id != user.pk or session.job_id != job.pk:
        return None
    return session
