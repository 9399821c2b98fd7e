"""The shared file systems a job's containers mount (jobs.models.SharedPath), made ready on each node.

Their paths were checked as text when they were registered and when the job was submitted, but podman mounts
whatever a path leads to on the node: a link there (the path itself or a folder above it) would mount /etc as
well as a dataset. So each is mounted only while the node resolves it to itself, a folder. A user's folder in a
writable one is made where missing (the first job writing there), as the job's uid's, and only where the file
system's own folder is root's and writable by no one else: no job ever sees that folder, and no other account
of the node may write in it, so no one can have made a user's folder first or put a link where it is made.
"""

import posixpath
from collections.abc import Sequence

import asyncssh

from jobs.launch.plan import JobPlan, WorkerPlan
from jobs.runtime.containers import JOB_UID, as_node_root
from jobs.runtime.ssh import NodeError, run_checked

# The file system's own folder takes users' folders only while no one but root (on a node reached without root,
# the Slurm user: root of its namespace, where this runs) may write in it: anyone else could make a user's
# folder first, theirs to read, or put a link where it is to go. Run with the folder (readlink -e resolved it to
# itself just before).
CHECK_ROOT = (r'set -- "$1" $(stat -c "%u %a" -- "$1") && [ "$2" = 0 ] && [ $(( 0$3 & 022 )) = 0 ] '
              r"""|| { echo "it may be written by others than root (owner uid $2, mode $3): register a folder of the """
              r"""console's own in it, root's and writable by no one else" >&2; exit 1; }""")
# A user's folder: made (one level) with its mode, or taken as it is only while it is a folder (no link) of the
# job's uid's or root's; given to the job's uid and closed to everyone else each time.
MAKE_OWN_FOLDER = (r'mkdir -p -m 700 -- "$1" && [ -d "$1" ] && [ ! -L "$1" ] '
                   r'|| { echo "it is there and is not a folder" >&2; exit 1; }; '
                   r'owner=$(stat -c %u -- "$1") && { [ "$owner" = 0 ] || [ "$owner" = "$2" ]; } '
                   r"""|| { echo "it belongs to uid $owner, not to the jobs' uid $2" >&2; exit 1; }; """
                   r'chown -h "$2:$2" -- "$1" && chmod 700 -- "$1"')


async def check_shared_paths(connection: asyncssh.SSHClientConnection, label: str, paths: Sequence[str]) -> None:
    """Each path must be, on this node, the folder it names; NodeError, naming the path, otherwise."""
    for path in paths:
        step = f"mounting the shared file system {path}"
        # One look a path: where it resolves (readlink -e follows every link and needs each part to exist; nothing
        # when it does not), and whether that is a folder.
        answer = (await run_checked(connection, label, step, [
            "sh", "-c", 'where=$(readlink -e -- "$1") || exit 0; [ -d "$where" ] && echo "dir $where" || echo "other $where"',
            "sh", path])).strip()
        kind, _, resolved = answer.partition(" ")
        if not resolved:
            raise NodeError(label, step, "it does not exist on this node: it is not mounted")
        if resolved != path:
            raise NodeError(label, step, f"it leads to {resolved} on this node (a link): it is not mounted")
        if kind != "dir":
            raise NodeError(label, step, "it is not a folder on this node: it is not mounted")


async def make_own_folders(connection: asyncssh.SSHClientConnection, worker: WorkerPlan, folders: Sequence[str]) -> None:
    """The owner's folders in writable shared file systems, made where missing and given to the job's uid (on a
    node reached without root, the uid the containers map it to)."""
    label = worker.node.label
    roots = sorted({posixpath.dirname(folder) for folder in folders})
    await check_shared_paths(connection, label, roots)
    for root in roots:
        await run_checked(connection, label, f"mounting the shared file system {root}",
                          as_node_root(worker, ["sh", "-c", CHECK_ROOT, "sh", root]))
    for folder in folders:
        await run_checked(connection, label, f"making your folder {folder} on the shared file system",
                          as_node_root(worker, ["sh", "-c", MAKE_OWN_FOLDER, "sh", folder, str(JOB_UID)]))


async def mount_points_ready(connection: asyncssh.SSHClientConnection, plan: JobPlan, worker: WorkerPlan) -> None:
    """Every shared folder the worker's container mounts, there on the node and no link, before it starts."""
    await make_own_folders(connection, worker, plan.writable_mounts)
    await check_shared_paths(connection, worker.node.label, [*plan.read_only_mounts, *plan.writable_mounts])
