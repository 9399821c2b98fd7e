"""Force release, the administrator's last resort for a job or a node the console cannot end or free itself.

A job is ended at once, without reaching its nodes (they may not answer): it becomes Abnormal and its
nodes are taken out of service until a health check has removed what the job left on them (the check
does that, see jobs.runtime.node_health). A node is freed only when no live job holds it, since giving a
running job's node to another job would book it twice. Both are written to the admin's log.
"""

from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction
from django.utils import timezone

from jobs.allocation import release_nodes
from jobs.models import FINAL_STATES, IllegalTransition, JobEvent, JobStatus, Node, TrainingJob
from jobs.results.checkpoints import close_attempt

LIVE_STATES = {JobStatus.CREATING, JobStatus.RUNNING, JobStatus.TERMINATING}


def _audit(user, obj, message: str) -> None:
    """Into the admin's own history of the object, beside its other changes."""
    LogEntry.objects.log_actions(user.pk, [obj], CHANGE, change_message=message, single_object=True)


def force_release_job(job: TrainingJob, user) -> None:
    """End a live job now and free its nodes for a check; IllegalTransition for a job that is not live."""
    if job.status not in LIVE_STATES:
        raise IllegalTransition(f"a job in state {job.status} has nothing to release")
    by = user.get_username()
    with transaction.atomic():
        nodes = Node.objects.filter(allocated_to=job)
        names = sorted(nodes.values_list("name", flat=True))
        nodes.update(state=Node.State.NOT_READY,
                     state_message=f"force released from job {job.pk} by {by}: cleaned by its next health check")
        release_nodes(job.pk)
        close_attempt(job.pk, f"force released by {by}")
        job.transition(JobStatus.ABNORMAL, f"Force released by {by}", heartbeat_at=timezone.now())
        message = f"Force released by {by}; nodes freed for a health check: {', '.join(names) or 'none'}"
        JobEvent.objects.create(job=job, kind="force-release", message=message)
        _audit(user, job, message)


def force_release_node(node: Node, user) -> None:
    """Free a node whose job has ended or is gone; IllegalTransition while a live job holds it."""
    holder = node.allocated_to
    if holder is not None and holder.status not in FINAL_STATES:
        raise IllegalTransition(f"job {holder.pk} ({holder.status}) still holds it: force release the job instead")
    if holder is not None and holder.held_until is not None:
        # Its containers still run there: the hold's end tears them down, then frees the node.
        raise IllegalTransition(f"job {holder.pk} holds it for debugging until {holder.held_until:%H:%M} UTC: "
                                "release the hold on the job's page (or wait for its end) instead")
    by = user.get_username()
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(
            allocated_to=None, state=Node.State.NOT_READY,
            state_message=f"force released by {by}: cleaned and made ready by its next health check")
        _audit(user, node, f"Force released by {by} (it was held by {f'job {holder.pk}' if holder else 'no job'})")
