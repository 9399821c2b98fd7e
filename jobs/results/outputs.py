"""A job's outputs: its train_url directory on worker-0, collected into the console's storage at its end.

The files are read over SFTP through worker-0's container sshd as the job's user, so paths mean what
they meant to the program and nothing the job could not read itself is copied. Files are kept in path
order while they fit within the administrator's limit; the rest are listed as not kept.
"""

import posixpath
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypedDict

from django.conf import settings

from jobs.logs.store import readable_size
from jobs.models import JobOutputFile, TrainingJob


class OutputsSummary(TypedDict):
    """What became of train_url (kept in TrainingJob.outputs_summary)."""

    state: str
    message: str
    train_url: str
    kept_files: int
    kept_bytes: int
    total_files: int
    total_bytes: int
    limit_bytes: int


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


@dataclass(frozen=True)
class FoundFile:
    path: str  # relative to train_url, with "/"
    size: int


@dataclass
class OutputsResult:
    # collected, partial, empty, missing, not_a_path, not_requested, not_collected, failed; on_shared: in the
    # owner's folder of a writable shared file system, listed and not copied (no file is "kept" here).
    state: str
    message: str
    files: list[FoundFile] = field(default_factory=list)
    kept: set[str] = field(default_factory=set)
    limit: int = 0

    def summary(self, train_url: str) -> OutputsSummary:
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
        return "collected", f"Collected {len(files)} file(s), {readable_size(total)}."
    left_out = sorted((item for item in files if item.path not in kept), key=lambda item: -item.size)
    named = ", ".join(f"{item.path} ({readable_size(item.size)})" for item in left_out[:5])
    more = f" and {len(left_out) - 5} more" if len(left_out) > 5 else ""
    kept_bytes = sum(item.size for item in files if item.path in kept)
    return "partial", (
        f"The outputs ({len(files)} files, {readable_size(total)}) exceed the limit of {readable_size(limit)}: "
        f"kept {len(kept)} file(s), {readable_size(kept_bytes)}; not kept: {named}{more}."
    )


def describe_shared(files: list[FoundFile], where: str, *, listed_all: bool) -> tuple[str, str]:
    if not files:
        return "empty", f"{where} on the shared file system held no file."
    total = readable_size(sum(item.size for item in files))
    counted = f"{len(files)} file(s), {total}" if listed_all else f"more than {len(files)} files (the first {len(files)}: {total})"
    return "on_shared", f"{counted} in {where} on the shared file system, where they stay: nothing was copied."


# The database and the stored files.

def record_outputs(job_id: int, train_url: str, result: OutputsResult) -> None:
    JobOutputFile.objects.filter(job_id=job_id).delete()
    JobOutputFile.objects.bulk_create(
        JobOutputFile(job_id=job_id, path=item.path, size=item.size, kept=item.path in result.kept)
        for item in result.files
    )
    TrainingJob.objects.filter(pk=job_id).update(outputs_summary=result.summary(train_url))


# The states of an output uploaded to an object store (jobs.runtime.data_out): its files are in the bucket.
IN_STORE_STATES = ("uploaded", "upload_partial", "upload_failed")


def in_store(summary: dict | None) -> bool:
    return bool(summary) and str((summary or {}).get("state", "")) in IN_STORE_STATES


def stored_file(job_id: int, path: str) -> Path | None:
    """The kept file at `path` in a job's outputs, or None; nothing outside the job's own folder is ever returned."""
    if not JobOutputFile.objects.filter(job_id=job_id, path=path, kept=True).exists():
        return None
    root = outputs_root(job_id).resolve()
    local = (root / path).resolve()
    return local if local.is_relative_to(root) and local.is_file() else None


def write_archive(job_id: int, target: IO[bytes]) -> None:
    """Every kept file of a job, as a .tar.gz written to a file object."""
    with tarfile.open(fileobj=target, mode="w:gz") as archive:
        for path in JobOutputFile.objects.filter(job_id=job_id, kept=True).order_by("path").values_list("path", flat=True):
            local = stored_file(job_id, path)
            if local is not None:
                archive.add(local, arcname=path, recursive=False)
