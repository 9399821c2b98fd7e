"""Code directories, the console's side: the shipped examples, uploads unpacked by the unpacker process
(jobs.code_dirs.unpacker) into a fresh folder and checked again here before they are moved into place,
each owner's in a folder of their own, and the names a submission picks them by.


An upload is unpacked by this module, never by tarfile's or zipfile's `extractall` (Debian's Python
3.11.2 has no tarfile `filter=`, and a filter is not a boundary one can rely on anyway):

- **Plain files and folders only.** Links are refused, symbolic and hard alike, whether they point
  inside the code directory or outside it: the reference platform's code directories are plain files.
  So are device files, fifos, sockets and anything else that is not a regular file or a folder.
- **Paths.** A member's path may not be absolute, hold `..` or a NUL, or nest folders deeper than
  `CODE_DIR_MAX_DEPTH`; a path given twice, or as both a file and a folder, is refused. All of this is
  checked for the whole archive before anything is written.
- **Writing** goes through directory file descriptors, never through a path: each folder is opened with
  `O_DIRECTORY | O_NOFOLLOW` relative to its parent, each file is created with
  `O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW`, so nothing is written through a link or over a file, and
  nothing can resolve outside the tree.
- **No owners, no special bits.** The archive's owners and modes are ignored: files are 0644, or 0755
  when the archive gave them any execute bit; folders 0755; no setuid, setgid or sticky bit, ever.
- **Limits** (the settings `CODE_DIR_MAX_*`): the upload's size, the number of files and of folders,
  the folders' depth, and the unpacked size. The unpacked size is checked against the sizes the archive
  declares before writing, and again by counting the bytes while writing, since headers can lie; an
  archive that unpacks to more than `CODE_DIR_MAX_COMPRESSION_RATIO` times its own size (past
  `RATIO_APPLIES_ABOVE`) is taken for a compression bomb. A damaged or truncated archive is a refusal
  like the others, with a message, never a server error.
- **All or nothing.** Everything is unpacked into a fresh temporary folder under `CODE_DIRS_ROOT` that is
  renamed into place only once the whole archive was accepted (and, for an upload, its name recorded);
  a refusal removes it.

**As whom.** The unpacking always happens in a process of its own, started by exec (`python -m
jobs.code_dirs.unpacker`): a fork of the multi-threaded web process would copy whatever lock another
thread held. When the console runs as root, that process drops to `CODE_DIR_UNPACK_USER` (`nobody`
unless configured) before it reads a byte, and writes into a folder made for it and given to that
account, reached only through a file descriptor it is handed, so the account needs no access to the
folders above it. The console then walks the result itself through file descriptors, never following a
link: it checks again that there are only regular files and folders within the limits, gives each to
the console's own account with the modes above, and only then moves it into place. When the console
does not run as root the process keeps the console's account: there is no privilege to drop.
"""

import contextlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.utils.translation import gettext

from jobs.code_dirs.policy import (
    CONTROL_CHARACTERS,
    EXECUTABLE_MODE,
    FILE_MODE,
    FOLDER_MODE,
    NAME_RE,
    NO_FILE,
    NO_PYTHON_FILE,
    ArchiveRejected,
    Limits,
    Unpacked,
    control_characters_refused,
    gettext_noop,
    not_plain_refused,
    upload_size_refusal,
)
from jobs.models import CodeDirectory

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What the unpacker may say: its one JSON answer.
MAX_ANSWER_BYTES = 1024 * 1024


def refusal_words(refusal: ArchiveRejected) -> str:
    """A refusal in the request's language (its English when the catalogue has no such words)."""
    try:
        return gettext(refusal.words) % refusal.params if refusal.params else gettext(refusal.words)
    except (KeyError, TypeError, ValueError):
        return str(refusal)


def _unpacker_refusal(answer: dict) -> ArchiveRejected:
    """The unpacker's refusal, its words kept for the page's language when they are whole."""
    words, params = answer.get("words"), answer.get("params")
    if isinstance(words, str) and isinstance(params, dict) and all(
            isinstance(key, str) and isinstance(value, str | int) for key, value in params.items()):
        try:
            return ArchiveRejected(words, params)
        except (KeyError, TypeError, ValueError):
            pass
    return ArchiveRejected(str(answer["refused"]))


def limits_from_settings() -> Limits:
    return Limits(
        upload_bytes=settings.CODE_DIR_MAX_UPLOAD_BYTES,
        unpacked_bytes=settings.CODE_DIR_MAX_UNPACKED_BYTES,
        files=settings.CODE_DIR_MAX_FILES,
        folders=settings.CODE_DIR_MAX_FOLDERS,
        depth=settings.CODE_DIR_MAX_DEPTH,
        ratio=settings.CODE_DIR_MAX_COMPRESSION_RATIO,
    )


def _unpack_account() -> tuple[int, int] | None:
    """The (uid, gid) to unpack as, or None when the console is not root (it then unpacks as itself)."""
    if os.geteuid() != 0:
        return None
    try:
        account = pwd.getpwnam(settings.CODE_DIR_UNPACK_USER)
    except KeyError:
        raise ImproperlyConfigured(f"CODE_DIR_UNPACK_USER={settings.CODE_DIR_UNPACK_USER!r} is no account here") from None
    if account.pw_uid == 0 or account.pw_gid == 0:
        raise ImproperlyConfigured(f"CODE_DIR_UNPACK_USER={settings.CODE_DIR_UNPACK_USER!r} must not be root")
    return account.pw_uid, account.pw_gid


def _run_unpacker(archive_fd: int, root_fd: int, limits: Limits, archive_size: int,
                  account: tuple[int, int] | None) -> tuple[int, int]:
    """The unpacker process over these descriptors; the (uid, gid) it wrote as, or ArchiveRejected."""
    request = json.dumps({"archive_fd": archive_fd, "root_fd": root_fd, "limits": limits.as_dict(),
                          "archive_size": archive_size, "account": list(account) if account else None})
    timeout = settings.CODE_DIR_UNPACK_TIMEOUT_SECONDS
    try:
        # -E -s: no PYTHON* variable and no user site changes what it runs; the checkout is its path.
        done = subprocess.run([sys.executable, "-E", "-s", "-m", "jobs.code_dirs.unpacker", request],
                              cwd=settings.BASE_DIR, env={"LC_ALL": "C.UTF-8"}, pass_fds=(archive_fd, root_fd),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ArchiveRejected(gettext_noop("unpacking the archive took longer than %(seconds)s seconds"),
                              {"seconds": timeout}) from None
    try:
        answer = json.loads(done.stdout[:MAX_ANSWER_BYTES]) if done.stdout else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ArchiveRejected(gettext_noop("the archive could not be unpacked (the unpacking process ended with "
                                           "status %(status)s)"), {"status": done.returncode})
    if "refused" in answer:
        raise _unpacker_refusal(answer)
    if "failed" in answer or done.returncode != 0:
        raise RuntimeError(f"unpacking the archive failed: {answer.get('failed', done.returncode)}")
    uid, gid = answer["unpacked_by"]
    return int(uid), int(gid)


@contextlib.contextmanager
def _as_descriptor(source: IO[bytes]):
    """A file descriptor holding the archive: the upload's own file, or a private copy of one in memory."""
    try:
        descriptor = source.fileno()
    except (OSError, AttributeError, ValueError):  # io.UnsupportedOperation is an OSError: no file under it
        descriptor = None
    if descriptor is not None:
        yield descriptor
        return
    with tempfile.TemporaryFile() as copy:
        source.seek(0)
        shutil.copyfileobj(source, copy)
        copy.flush()
        yield copy.fileno()



@dataclass
class _Count:
    files: int = 0
    bytes: int = 0
    folders: int = 0
    python_files: int = 0


def _settle(folder_fd: int, path: str, depth: int, count: _Count, limits: Limits, owner: tuple[int, int] | None) -> None:
    """Check and own everything under folder_fd: regular files and folders only, within the limits; never a link followed."""
    with os.scandir(folder_fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        where = f"{path}/{name}" if path else name
        if CONTROL_CHARACTERS.search(name):
            raise control_characters_refused(where)
        before = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        if stat.S_ISDIR(before.st_mode):
            count.folders += 1
            if count.folders > limits.folders or depth + 1 > limits.depth:
                raise ArchiveRejected(gettext_noop("the archive holds more folders, or deeper ones, than allowed "
                                                   "(%(path)s)"), {"path": where})
            fd = os.open(name, _DIR_FLAGS, dir_fd=folder_fd)
            try:
                _own(fd, before, FOLDER_MODE, owner, where)
                _settle(fd, where, depth + 1, count, limits, owner)
            finally:
                os.close(fd)
        elif stat.S_ISREG(before.st_mode):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
            try:
                now = os.fstat(fd)
                if now.st_nlink != 1:
                    raise not_plain_refused(where, "hard")
                count.files += 1
                count.bytes += now.st_size
                count.python_files += name.endswith(".py")
                if count.files > limits.files or count.bytes > limits.unpacked_bytes:
                    raise ArchiveRejected(gettext_noop("the archive holds more files or bytes than allowed (%(path)s)"),
                                          {"path": where})
                _own(fd, before, EXECUTABLE_MODE if before.st_mode & 0o111 else FILE_MODE, owner, where)
            finally:
                os.close(fd)
        else:
            raise not_plain_refused(where, "other")


def _own(fd: int, seen: os.stat_result, mode: int, owner: tuple[int, int] | None, where: str) -> None:
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino) or stat.S_IFMT(now.st_mode) != stat.S_IFMT(seen.st_mode):
        raise ArchiveRejected(gettext_noop("%(path)s changed while it was being checked"), {"path": where})
    if owner is not None:
        os.fchown(fd, *owner)
    os.fchmod(fd, mode)


def unpack(archive: Path | IO[bytes], destination: Path, limits: Limits | None = None) -> Unpacked:
    """Unpack an archive into destination, which must not exist yet; all of it, or nothing (ArchiveRejected).

    An archive of a single folder (`gpu-train/...`) holds the code directory itself: that folder becomes
    destination.
    """
    limits = limits or limits_from_settings()
    if os.path.lexists(destination):
        raise FileExistsError(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    account = _unpack_account()
    opened = open(archive, "rb") if isinstance(archive, Path) else contextlib.nullcontext(archive)
    with opened as source:
        archive_size = source.seek(0, os.SEEK_END)
        if archive_size > limits.upload_bytes:
            raise upload_size_refusal(archive_size, limits.upload_bytes)
        scratch = Path(tempfile.mkdtemp(prefix=".unpack-", dir=destination.parent))
        try:
            unpacked = scratch / "unpacked"
            unpacked.mkdir(mode=0o700)
            root_fd = os.open(unpacked, _DIR_FLAGS)
            try:
                if account is not None:
                    os.fchown(root_fd, *account)  # the unprivileged child's to write in, and nothing above it
                os.fchmod(root_fd, 0o700)
                with _as_descriptor(source) as archive_fd:
                    unpacked_by = _run_unpacker(archive_fd, root_fd, limits, archive_size, account)
                owner = (os.geteuid(), os.getegid()) if account is not None else None
                count = _Count()
                _own(root_fd, os.fstat(root_fd), FOLDER_MODE, owner, ".")
                _settle(root_fd, "", 0, count, limits, owner)
            finally:
                os.close(root_fd)
            if not count.files:
                raise ArchiveRejected(NO_FILE)
            if not count.python_files:
                raise ArchiveRejected(NO_PYTHON_FILE)
            entries = list(unpacked.iterdir())
            if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
                top, count.folders = entries[0], count.folders - 1
            else:
                top = unpacked
            os.rename(top, destination)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return Unpacked(count.files, count.bytes, count.folders, unpacked_by)


def create_from_archive(name: str, archive: Path | IO[bytes], owner=None, sharing: str = CodeDirectory.Sharing.PRIVATE,
                        shared_with=None) -> CodeDirectory:
    """An uploaded archive as a new code directory of the owner's, private unless said otherwise."""
    problem = _name_problem(name, owner)
    if problem:
        raise problem
    if sharing not in CodeDirectory.Sharing.values:
        raise ArchiveRejected(gettext_noop("Choose one of %(choices)s."), {"choices": ", ".join(CodeDirectory.Sharing.values)},
                              field="sharing")
    # Each owner's directories in a folder of their own: two users may each have a "train".
    root = Path(settings.CODE_DIRS_ROOT) / (f"user-{owner.pk}" if owner is not None else "shared")
    root.mkdir(parents=True, exist_ok=True)
    destination = root / name
    with tempfile.TemporaryDirectory(prefix=".upload-", dir=root) as holding:
        staged = Path(holding) / name
        unpacked = unpack(archive, staged)
        try:
            with transaction.atomic():
                if CodeDirectory.objects.filter(path=str(destination)).exists():
                    raise _name_taken(name)
                code_dir = CodeDirectory.objects.create(
                    name=name, path=str(destination), file_count=unpacked.files, size_bytes=unpacked.bytes, owner=owner,
                    sharing=sharing, shared_with=shared_with if sharing == CodeDirectory.Sharing.GROUP else None)
                if os.path.lexists(destination):
                    # Left on disk by a code directory no longer recorded: set aside, removed with the holding folder.
                    os.rename(destination, Path(holding) / ".replaced")
                os.rename(staged, destination)
        except IntegrityError:
            raise _name_taken(name) from None
    return code_dir


def _name_taken(name: str) -> ArchiveRejected:
    return ArchiveRejected(gettext_noop("You already have a code directory named %(name)s; choose another name."),
                           {"name": repr(name)}, field="name")


def _name_problem(name: str, owner=None) -> ArchiveRejected | None:
    if not NAME_RE.fullmatch(name or ""):
        return ArchiveRejected(gettext_noop("Use 1 to 64 letters, digits, '-' or '_'."), field="name")
    if CodeDirectory.objects.filter(name=name, owner=owner).exists():
        return _name_taken(name)
    return None


def name_refusal(name: str, owner=None) -> str | None:
    """What is wrong with a new code directory's name, in the request's language, or None: its form, and that the
    owner has none of that name (other users' names are theirs to reuse and are never revealed)."""
    problem = _name_problem(name, owner)
    return refusal_words(problem) if problem else None


def register(name: str, path: Path, owner=None, sharing: str = CodeDirectory.Sharing.PRIVATE) -> CodeDirectory:
    files = [entry for entry in path.rglob("*") if entry.is_file()]
    with transaction.atomic():
        code_dir, _ = CodeDirectory.objects.update_or_create(
            name=name, owner=owner,
            defaults={
                "path": str(path),
                "file_count": len(files),
                "size_bytes": sum(entry.stat().st_size for entry in files),
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
        # A name with control characters (one uploaded before they were refused) is never offered.
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")) and not CONTROL_CHARACTERS.search(d))
        for filename in sorted(filenames):
            if filename.endswith(".py") and not CONTROL_CHARACTERS.search(filename):
                found.append(str(Path(dirpath, filename).relative_to(root)))
                if len(found) >= limit:
                    return found
    return found
