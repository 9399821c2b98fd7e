"""Code directories: the shipped examples, and archives users upload (checked before anything is written)."""

import os
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.db import transaction

from .models import CodeDirectory


class ArchiveRejected(ValueError):
    pass


@dataclass(frozen=True)
class ArchiveMember:
    path: PurePosixPath
    size: int
    is_dir: bool
    link_target: str | None


def _safe_member_path(name: str) -> PurePosixPath:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts:
        raise ArchiveRejected(f"{name!r} would be written outside the code directory")
    return PurePosixPath(*[part for part in path.parts if part not in ("", ".")])


def _link_stays_inside(member: PurePosixPath, target: str) -> bool:
    if target.startswith("/"):
        return False
    depth = len(member.parent.parts)
    for part in PurePosixPath(target).parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return False
    return True


def _members(archive_path: Path) -> tuple[str, list[ArchiveMember]]:
    if zipfile.is_zipfile(archive_path):
        with zipfile.ZipFile(archive_path) as archive:
            members = []
            for info in archive.infolist():
                is_link = (info.external_attr >> 16) & 0o170000 == 0o120000
                target = archive.read(info).decode("utf-8", "replace") if is_link else None
                members.append(ArchiveMember(_safe_member_path(info.filename), info.file_size, info.is_dir(), target))
            return "zip", members
    try:
        with tarfile.open(archive_path, "r:*") as archive:
            members = []
            for info in archive.getmembers():
                if not (info.isfile() or info.isdir() or info.issym()):
                    raise ArchiveRejected(f"{info.name!r} is not a regular file, folder or symbolic link")
                members.append(
                    ArchiveMember(_safe_member_path(info.name), info.size, info.isdir(), info.linkname if info.issym() else None)
                )
            return "tar", members
    except tarfile.TarError:
        raise ArchiveRejected("the file is neither a .zip nor a .tar.gz archive") from None


def check_archive(archive_path: Path) -> tuple[str, list[ArchiveMember]]:
    kind, members = _members(archive_path)
    files = [member for member in members if not member.is_dir]
    if not files:
        raise ArchiveRejected("the archive holds no file")
    if len(files) > settings.CODE_DIR_MAX_FILES:
        raise ArchiveRejected(f"the archive holds {len(files)} files; at most {settings.CODE_DIR_MAX_FILES} are allowed")
    total = sum(member.size for member in files)
    if total > settings.CODE_DIR_MAX_BYTES:
        raise ArchiveRejected(f"the archive unpacks to {total} bytes; at most {settings.CODE_DIR_MAX_BYTES} are allowed")
    for member in files:
        if member.link_target is not None and not _link_stays_inside(member.path, member.link_target):
            raise ArchiveRejected(f"{member.path} links to {member.link_target!r}, outside the code directory")
    return kind, members


def _single_top_folder(root: Path) -> Path:
    """An archive of `gpu-train/…` holds the code directory itself, not a folder around it."""
    entries = list(root.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return root


def create_from_archive(name: str, archive_path: Path, owner=None) -> CodeDirectory:
    kind, _ = check_archive(archive_path)
    if CodeDirectory.objects.filter(name=name).exists():
        raise ArchiveRejected(f"a code directory named {name!r} already exists")
    settings.CODE_DIRS_ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=settings.CODE_DIRS_ROOT) as scratch:
        unpacked = Path(scratch) / "unpacked"
        if kind == "zip":
            with zipfile.ZipFile(archive_path) as archive:
                archive.extractall(unpacked)
        else:
            with tarfile.open(archive_path, "r:*") as archive:
                # check_archive already refused escapes and special files; the data filter, where this
                # Python has it (3.11.4+), also drops odd permission bits.
                extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                archive.extractall(unpacked, **extra)
        destination = settings.CODE_DIRS_ROOT / name
        if destination.exists():
            shutil.rmtree(destination)
        shutil.move(str(_single_top_folder(unpacked)), destination)
    return register(name, destination, owner)


def register(name: str, path: Path, owner=None, sharing: str = CodeDirectory.Sharing.PRIVATE) -> CodeDirectory:
    files = [entry for entry in path.rglob("*") if entry.is_file()]
    with transaction.atomic():
        code_dir, _ = CodeDirectory.objects.update_or_create(
            name=name,
            defaults={
                "path": str(path),
                "file_count": len(files),
                "size_bytes": sum(entry.stat().st_size for entry in files),
                "owner": owner,
                "sharing": sharing,
            },
        )
    return code_dir


def register_examples() -> list[CodeDirectory]:
    examples = Path(settings.EXAMPLES_DIR)
    if not examples.is_dir():
        return []
    # The shipped examples are everyone's to run.
    return [register(folder.name, folder, sharing=CodeDirectory.Sharing.EVERYONE)
            for folder in sorted(examples.iterdir()) if folder.is_dir()]


def python_files(code_dir: CodeDirectory, limit: int = 1000) -> list[str]:
    root = Path(code_dir.path)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
        for filename in sorted(filenames):
            if filename.endswith(".py"):
                found.append(str(Path(dirpath, filename).relative_to(root)))
                if len(found) >= limit:
                    return found
    return found
