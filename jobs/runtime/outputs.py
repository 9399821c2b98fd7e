"""Collecting a job's outputs: its train_url directory on worker-0, copied into the console's storage at its end.

The files are read over SFTP through worker-0's container sshd as the job's user, so paths mean what
they meant to the program and nothing the job could not read itself is copied. Which files are kept
within the administrator's limit is decided in jobs.results.outputs.
"""

import asyncio
import posixpath
import stat
from collections.abc import Awaitable
from pathlib import Path

import asyncssh

from jobs.launch.plan import SshTarget
from jobs.results.outputs import FoundFile, OutputsResult, choose_kept, describe, describe_shared
from jobs.runtime.ssh import NodeError, connect

MAX_FILES = 10000
COPY_CHUNK = 256 * 1024
COLLECT_TIMEOUT_SECONDS = 900


async def _walk(sftp: asyncssh.SFTPClient, root: str, *, cut_at_most: bool = False) -> list[FoundFile]:
    """The regular files under root; past MAX_FILES a NodeError, or (cut_at_most) the first MAX_FILES + 1 found."""
    found: list[FoundFile] = []
    pending = [""]
    while pending:
        relative = pending.pop()
        async for entry in sftp.scandir(posixpath.join(root, relative) if relative else root):
            # asyncssh gives names as text with the default encoding (bytes only when asked for them).
            name = entry.filename if isinstance(entry.filename, str) else entry.filename.decode(errors="replace")
            if name in (".", "..") or "/" in name:
                continue
            mode = entry.attrs.permissions or 0
            path = f"{relative}/{name}" if relative else name
            # Links are not followed: they could lead anywhere the job's user can read.
            if stat.S_ISDIR(mode):
                pending.append(path)
            elif stat.S_ISREG(mode):
                found.append(FoundFile(path, entry.attrs.size or 0))
                if len(found) > MAX_FILES and cut_at_most:
                    return found
                if len(found) > MAX_FILES:
                    raise NodeError("worker-0", "listing the outputs", f"more than {MAX_FILES} files")
    return found


async def _copy(sftp: asyncssh.SFTPClient, remote: str, local: Path, size: int) -> None:
    local.parent.mkdir(parents=True, exist_ok=True)
    copied = 0
    async with sftp.open(remote, "rb") as source:
        # Each run has an event loop of its own, in a thread of its own: a local write holds up nothing else.
        with open(local, "wb") as target:  # noqa: ASYNC230
            # A file still growing is cut at the size it was listed with, so the limit holds.
            while copied < size:
                chunk = await source.read(min(COPY_CHUNK, size - copied))
                if not chunk:
                    break
                target.write(chunk if isinstance(chunk, bytes) else chunk.encode())
                copied += len(chunk)


async def collect_outputs(target: SshTarget, remote_dir: str, destination: Path, limit: int) -> OutputsResult:
    return await _within_time(_collect(target, remote_dir, destination, limit), limit)


async def list_shared_outputs(target: SshTarget, remote_dir: str) -> OutputsResult:
    """train_url in the owner's folder of a writable shared file system: its files are already where they are
    kept, so they are listed (names and sizes, for the job's page), not copied."""
    return await _within_time(_collect(target, remote_dir, None, 0), 0)


async def _within_time(work: Awaitable[OutputsResult], limit: int) -> OutputsResult:
    try:
        return await asyncio.wait_for(work, COLLECT_TIMEOUT_SECONDS)
    except NodeError as error:
        return OutputsResult("failed", str(error), limit=limit)
    except TimeoutError:
        return OutputsResult("failed", f"Collecting the outputs took longer than {COLLECT_TIMEOUT_SECONDS} s.", limit=limit)
    except (OSError, asyncssh.Error) as error:
        return OutputsResult("failed", f"Collecting the outputs failed: {error}", limit=limit)


async def _collect(target: SshTarget, remote_dir: str, destination: Path | None, limit: int) -> OutputsResult:
    """Copy what fits the limit into `destination`; with none, only list the files (list_shared_outputs)."""
    connection = await connect(target)
    async with connection, connection.start_sftp_client() as sftp:
        try:
            if not await sftp.isdir(remote_dir):
                return OutputsResult("missing", f"{remote_dir} is not a directory on worker-0.", limit=limit)
        except asyncssh.SFTPError as error:
            return OutputsResult("missing", f"{remote_dir} cannot be read on worker-0: {error.reason}", limit=limit)
        if destination is None:
            files = await _walk(sftp, remote_dir, cut_at_most=True)
            state, message = describe_shared(files[:MAX_FILES], remote_dir, listed_all=len(files) <= MAX_FILES)
            return OutputsResult(state, message, files[:MAX_FILES])
        files = await _walk(sftp, remote_dir)
        kept = choose_kept(files, limit)
        root = destination.resolve()  # noqa: ASYNC240 - the run's own event loop (see _copy)
        for item in sorted(files, key=lambda item: item.path):
            if item.path not in kept:
                continue
            local = (root / item.path).resolve()
            if not local.is_relative_to(root):
                kept.discard(item.path)
                continue
            try:
                await _copy(sftp, posixpath.join(remote_dir, item.path), local, item.size)
            except asyncssh.SFTPError:
                # Gone or unreadable since it was listed: it is reported as not kept.
                kept.discard(item.path)
    state, message = describe(files, kept, limit)
    return OutputsResult(state, message, files, kept, limit)
