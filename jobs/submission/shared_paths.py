"""The checks a data_url, further input or train_url that is a path on a shared file system gets at submission
(jobs.models.SharedPath): a job is refused where the user typed the path when its containers would not see it
(another user's folder in a writable one) or could not write it (train_url on a read-only one)."""

from __future__ import annotations

import posixpath

from django.utils.translation import gettext as _

from jobs.launch.data_paths import is_input, location_path
from jobs.models import ResourcePool, SharedPath


def shared_path_problem(name: str, text: str, user_id: int | None, username: str, pool: ResourcePool | None) -> str:
    """Why the path `text`, typed as an input (data_url, data_url_1 ...) or train_url, cannot be used ("" when it
    can, or when no shared file system of the job's pool holds it)."""
    path = location_path(text)
    if not path.startswith("/"):
        return ""
    shared = SharedPath.covering(path, pool.pk if pool else None)
    if shared is None:
        return ""
    if posixpath.normpath(path) != path:
        return _("Write the path plainly: no '.', '..' or '//' in it.")
    if not shared.writable:
        if is_input(name):
            return ""
        return _("%(path)s is on the shared file system %(name)s, which jobs only read: give train_url a folder of "
                 "yours on a writable one, or an s3:// URL.") % {"path": path, "name": shared.name}
    if user_id is None:
        return _("Sign in to use a shared file system.")
    own = shared.user_folder(user_id, username)
    if path != own and not path.startswith(own + "/"):
        return _("On the shared file system %(name)s your jobs see your own folder only, %(own)s: give a path "
                 "inside it.") % {"name": shared.name, "own": own}
    return ""
