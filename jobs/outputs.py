"""A job's outputs: its train_url directory on worker-0, collected into the console's storage at its end.

The files are read over SFTP through worker-0's container sshd as the job's user, so paths mean what
they meant to the program and nothing the job could not read itself is copied. Files are kept in path
order while they fit within the administrator's limit; the rest are listed as not kept.
"""

import asyncio
import posixpath
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
from django.conf import settings

from .node_ssh import NodeError, SshTarget, connect

MAX_FILES = 10000
COPY_CHUNK = 256 * 1024
COLLECT_TIMEOUT_SECONDS = 900


def outputs_root(job_id: int) -> Path:
    return Path(settings.VAR_DIR) / "job-outputs" / str(job_id)


def train_url_of(parameters: list[dict]) -> str:
    return next((str(item.get("value", "")) for item in parameters if item.get("name") == "train_url"), "")


def container_path(train_url: str, working_dir: str) -> str | None:
    """Where train_url is in the container: absolute as given, relative to the working directory, or None (a URL)."""
    text = train_url.strip()
    if not text or "://" in text:
        return None
    return posixpath.normpath(text if text.startswith("/") else posixpath.join(working_dir, text))


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} bytes"


@dataclass(frozen=True)
class FoundFile:
    path: str  # relative to train_url, with "/"
    size: int


@dataclass
class OutputsResult:
    state: str  # collected, partial, empty, missing, not_a_path, not_requested, not_collected, failed
    message: str
    files: list[FoundFile] = field(default_factory=list)
    kept: set[str] = field(default_factory=set)
    limit: int = 0

    def summary(self, train_url: str) -> dict:
        kept_bytes = sum(item.size for item in self.files if item.path in self.kept)
        return {
            "state": self.state,
            "message": self.message,
            "train_url": train_url,
            "kept_files": len(self.kept),
            "kept_bytes": kept_bytes,
            "total_files": len(self.files),
            "total_bytes": sum(item.size for item in self.files),
            "limit_bytes": self.limit,
        }


def choose_kept(files: list[FoundFile], limit: int) -> set[str]:
    """Files in path order while they fit; one that does not fit is passed over, smaller ones after it may still fit."""
    kept, used = set(), 0
    for item in sorted(files, key=lambda item: item.path):
        if used + item.size <= limit:
            kept.add(item.path)
            used += item.size
    return kept


def describe(files: list[FoundFile], kept: set[str], limit: int) -> tuple[str, str]:
    if not files:
        return "empty", "The output directory held no file."
    total = sum(item.size for item in files)
    if len(kept) == len(files):
        return "collected", f"Collected {len(files)} file(s), {human_bytes(total)}."
    left_out = sorted((item for item in files if item.path not in kept), key=lambda item: -item.size)
    named = ", ".join(f"{item.path} ({human_bytes(item.size)})" for item in left_out[:5])
    more = f" and {len(left_out) - 5} more" if len(left_out) > 5 else ""
    kept_bytes = sum(item.size for item in files if item.path in kept)
    return "partial", (
        f"The outputs ({len(files)} files, {human_bytes(total)}) exceed the limit of {human_bytes(limit)}: "
        f"kept {len(kept)} file(s), {human_bytes(kept_bytes)}; not kept: {named}{more}."
    )


async def _walk(sftp: asyncssh.SFTPClient, root: str) -> list[FoundFile]:
    found, pending = [], [""]
    while pending:
        relative = pending.pop()
        async for entry in sftp.scandir(posixpath.join(root, relative) if relative else root):
            name = entry.filename
            if name in (".", "..") or "/" in name:
                continue
            mode = entry.attrs.permissions or 0
            path = f"{relative}/{name}" if relative else name
            # Links are not followed: they could lead anywhere the job's user can read.
            if stat.S_ISDIR(mode):
                pending.append(path)
            elif stat.S_ISREG(mode):
                found.append(FoundFile(path, entry.attrs.size or 0))
                if len(found) > MAX_FILES:
                    raise NodeError("worker-0", "listing the outputs", f"more than {MAX_FILES} files")
    return found


async def _copy(sftp: asyncssh.SFTPClient, remote: str, local: Path, size: int) -> None:
    local.parent.mkdir(parents=True, exist_ok=True)
    copied = 0
    async with sftp.open(remote, "rb") as source:
        with open(local, "wb") as target:
            # A file still growing is cut at the size it was listed with, so the limit holds.
            while copied < size:
                chunk = await source.read(min(COPY_CHUNK, size - copied))
                if not chunk:
                    break
                target.write(chunk)
                copied += len(chunk)


async def collect_outputs(target: SshTarget, remote_dir: str, destination: Path, limit: int) -> OutputsResult:
    try:
        return await asyncio.wait_for(_collect(target, remote_dir, destination, limit), COLLECT_TIMEOUT_SECONDS)
    except NodeError as error:
        return OutputsResult("failed", str(error), limit=limit)
    except asyncio.TimeoutError:
        return OutputsResult("failed", f"Collecting the outputs took longer than {COLLECT_TIMEOUT_SECONDS} s.", limit=limit)
    except (OSError, asyncssh.Error) as error:
        return OutputsResult("failed", f"Collecting the outputs failed: {error}", limit=limit)


async def _collect(target: SshTarget, remote_dir: str, destination: Path, limit: int) -> OutputsResult:
    connection = await connect(target)
    async with connection, connection.start_sftp_client() as sftp:
        try:
            if not await sftp.isdir(remote_dir):
                return OutputsResult("missing", f"{remote_dir} is not a directory on worker-0.", limit=limit)
        except asyncssh.SFTPError as error:
            return OutputsResult("missing", f"{remote_dir} cannot be read on worker-0: {error.reason}", limit=limit)
        files = await _walk(sftp, remote_dir)
        kept = choose_kept(files, limit)
        root = destination.resolve()
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


# The database and the stored files.

def record_outputs(job_id: int, train_url: str, result: OutputsResult) -> None:
    from .models import JobOutputFile, TrainingJob

    JobOutputFile.objects.filter(job_id=job_id).delete()
    JobOutputFile.objects.bulk_create(
        JobOutputFile(job_id=job_id, path=item.path, size=item.size, kept=item.path in result.kept)
        for item in result.files
    )
    TrainingJob.objects.filter(pk=job_id).update(outputs_summary=result.summary(train_url))


def stored_file(job_id: int, path: str) -> Path | None:
    """The kept file at `path` in a job's outputs, or None; nothing outside the job's own folder is ever returned."""
    from .models import JobOutputFile

    if not JobOutputFile.objects.filter(job_id=job_id, path=path, kept=True).exists():
        return None
    root = outputs_root(job_id).resolve()
    local = (root / path).resolve()
    return local if local.is_relative_to(root) and local.is_file() else None


def write_archive(job_id: int, target) -> None:
    """Every kept file of a job, as a .tar.gz written to a file object."""
    from .models import JobOutputFile

    with tarfile.open(fileobj=target, mode="w:gz") as archive:
        for path in JobOutputFile.objects.filter(job_id=job_id, kept=True).order_by("path").values_list("path", flat=True):
            local = stored_file(job_id, path)
            if local is not None:
                archive.add(local, arcname=path, recursive=False)
