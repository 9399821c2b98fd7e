"""SSH to nodes and to job containers with asyncssh: pinned host keys and a timeout on every step."""

import asyncio
import shlex
from pathlib import PurePosixPath

import asyncssh
from django.conf import settings

from jobs.launch.plan import SshTarget


class NodeError(Exception):
    """A step on one node failed; the message says which node, which step and why."""

    def __init__(self, node: str, step: str, reason: str):
        super().__init__(f"{node}: {step} failed: {reason}")
        self.node = node
        self.step = step
        self.reason = reason


def known_hosts(target: SshTarget) -> asyncssh.SSHKnownHosts | None:
    """The target's pinned host key for asyncssh; None trusts the first key seen (the caller pins it)."""
    if not target.host_key:
        return None
    host = target.address if target.port == 22 else f"[{target.address}]:{target.port}"
    return asyncssh.import_known_hosts(f"{host} {target.host_key.strip()}\n")


def _reason(error: BaseException) -> str:
    if isinstance(error, asyncssh.HostKeyNotVerifiable):
        return "the host key does not match the pinned key (refusing to connect)"
    if isinstance(error, asyncssh.PermissionDenied):
        return "the SSH key was refused"
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        return "timed out"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (is sshd running?)"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error) or type(error).__name__


async def connect(target: SshTarget) -> asyncssh.SSHClientConnection:
    try:
        return await asyncio.wait_for(
            asyncssh.connect(
                target.address,
                port=target.port,
                username=target.username,
                client_keys=[asyncssh.import_private_key(target.private_key)],
                known_hosts=known_hosts(target),
                connect_timeout=settings.SSH_CONNECT_TIMEOUT,
                login_timeout=settings.SSH_CONNECT_TIMEOUT,
                keepalive_interval=15,
                keepalive_count_max=4,
            ),
            timeout=settings.SSH_CONNECT_TIMEOUT * 2,
        )
    except (TimeoutError, OSError, asyncssh.Error) as error:
        raise NodeError(target.label, f"SSH to {target.address}:{target.port}", _reason(error)) from error


def host_key_line(connection: asyncssh.SSHClientConnection) -> str:
    key = connection.get_server_host_key()
    return key.export_public_key("openssh").decode().strip() if key else ""


async def run_checked(
    connection: asyncssh.SSHClientConnection, label: str, step: str, argv: list[str],
    timeout: float | None = None,  # noqa: ASYNC109 - handed to asyncssh, which bounds the remote command by it
    input_text: str | None = None,
) -> str:
    """Run argv (quoted, so nothing in it is interpreted by the remote shell), with input_text on its stdin; return
    its stdout."""
    try:
        result = await connection.run(shlex.join(argv), check=False, timeout=timeout or settings.SSH_COMMAND_TIMEOUT,
                                      **({"input": input_text} if input_text is not None else {}))
    except (TimeoutError, OSError, asyncssh.Error) as error:
        raise NodeError(label, step, _reason(error)) from error
    if result.exit_status != 0:
        detail = (str(result.stderr or "").strip() or str(result.stdout or "").strip())[-2000:]
        raise NodeError(label, step, f"exit status {result.exit_status}: {detail}")
    return str(result.stdout or "")


# A folder made for the files, as `mkdir -p` under root's usual umask makes it: the job's uid must pass
# through it, whatever umask the node's sftp-server is told to apply (`-u`).
FOLDER_MODE = 0o755
PRIVATE_FOLDER_MODE = 0o700


async def upload(connection: asyncssh.SSHClientConnection, label: str, files: dict[str, str],
                 folder: str | None = None) -> None:
    """Copy local files to remote paths over SFTP ({local: remote}), into `folder` made first when given
    (in the same session: a `mkdir -p` of its own cost a worker's preparation a command's round trip). The
    folder itself is its owner's alone (an earlier attempt's too): the files hold the job's keys and code, and
    whoever lays them out opens it to the job."""
    try:
        async with connection.start_sftp_client() as sftp:
            if folder:
                await _make_folder(sftp, label, folder)
                await sftp.chmod(folder, PRIVATE_FOLDER_MODE)
            for local, remote in files.items():
                await sftp.put(local, remote)
    except (TimeoutError, OSError, asyncssh.Error) as error:
        raise NodeError(label, "upload", _reason(error)) from error


async def _make_folder(sftp: asyncssh.SFTPClient, label: str, folder: str) -> None:
    path = PurePosixPath("/")
    for part in PurePosixPath(folder).parts[1:]:
        path /= part
        if await sftp.isdir(str(path)):
            continue
        try:
            await sftp.mkdir(str(path))
        except asyncssh.SFTPError as error:
            if not await sftp.isdir(str(path)):  # made meanwhile by another job's preparation: fine
                raise NodeError(label, f"making {path}", _reason(error)) from error
            continue
        await sftp.chmod(str(path), FOLDER_MODE)
