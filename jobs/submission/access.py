"""Who may see and act on which job: owners their own; staff others' only with the permission an admin gives.

Seeing another's job takes `view_trainingjob`, stopping it `change_trainingjob`, deleting it
`delete_trainingjob` (a superuser has them all); being staff alone gives none of them.

Code directories are private to their owner unless shared with everyone or with one group; seeing all of
them takes `view_codedirectory`, and only the owner changes whom one is shared with.
"""

from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet

from jobs.models import CodeDirectory, TrainingJob

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


# Code directories: an owner's own, everyone's, and those shared with one of the user's groups.
VIEW_ALL_CODE_DIRS = "jobs.view_codedirectory"


def visible_code_dirs(user) -> QuerySet[CodeDirectory]:
    """The code directories a user may list, pick and run: their own, everyone's, and their groups'.

    With no user (or an anonymous one), only everyone's; `view_codedirectory` shows them all.
    """
    code_dirs = CodeDirectory.objects.select_related("owner", "shared_with")
    if user is None or not user.is_authenticated:
        return code_dirs.filter(sharing=CodeDirectory.Sharing.EVERYONE)
    if user.has_perm(VIEW_ALL_CODE_DIRS):
        return code_dirs
    return code_dirs.filter(
        Q(owner=user)
        | Q(sharing=CodeDirectory.Sharing.EVERYONE)
        | Q(sharing=CodeDirectory.Sharing.GROUP, shared_with__in=user.groups.all())
    )


def may_share_code_dir(user, code_dir: CodeDirectory) -> bool:
    """Only a code directory's owner says who else may see it."""
    return code_dir.owner_id is not None and code_dir.owner_id == user.pk
