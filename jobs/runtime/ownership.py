"""Whether a console process follows a job's run now: what the stop task, the reaper and a take-over ask.

A run names its process in TrainingJob.run_owner ("host:pid:nonce") and beats TrainingJob.heartbeat_at.
"""

import os
import socket
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from jobs.models import TrainingJob


def owner_is_gone(owner: str) -> bool:
    """Whether run_owner names a process of this host that has ended (elsewhere only the heartbeat tells)."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def followed_by_a_live_run(job: TrainingJob) -> bool:
    """An owner whose beat is fresh and whose process, when it is one of this host's, still exists."""
    if not job.run_owner or job.heartbeat_at is None:
        return False
    if timezone.now() - job.heartbeat_at > timedelta(seconds=settings.RUN_STALE_SECONDS):
        return False
    return not owner_is_gone(job.run_owner)
