"""Who may see and act on which job: owners their own; staff others' only with the permission an admin gives.

Seeing another's job takes `view_trainingjob`, stopping it `change_trainingjob`, deleting it
`delete_trainingjob` (a superuser has them all); being staff alone gives none of them.
"""

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet

from jobs.models import TrainingJob

VIEW_OTHERS = "jobs.view_trainingjob"
STOP_OTHERS = "jobs.change_trainingjob"
DELETE_OTHERS = "jobs.delete_trainingjob"


def visible_jobs(user) -> QuerySet[TrainingJob]:
    jobs = TrainingJob.objects.select_related("owner", "spec", "engine_version__engine", "code_dir")
    if user.has_perm(VIEW_OTHERS):
        return jobs
    return jobs.filter(owner=user)


def ensure_may(user, job: TrainingJob, permission: str) -> None:
    """Refuse (403) an action on another's job to a user without the permission for it."""
    if job.owner_id != user.pk and not user.has_perm(permission):
        raise PermissionDenied("Only the job's owner, or an administrator given the permission, may do this.")
