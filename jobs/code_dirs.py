"""Code directories: the shipped examples, and the archives users upload (.zip, .tar.gz).

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

**As whom.** The unpacking always happens in a child process (`os.fork`). When the console runs as
root, the child drops to `CODE_DIR_UNPACK_USER` (`nobody` unless configured) before it reads a byte:
`setgroups([])`, `setgid`, `setuid`, then it checks that no root id is left. It writes into a folder
made for it and given to that account, reached only through a file descriptor the parent opened, so
the account needs no access to the folders above it (the checkout may live under /root), and its
`RLIMIT_FSIZE` caps any file it writes at the unpacked-size limit. Forking rather than running a
subprocess is the choice because the child needs to read nothing from disk (its code is already in
memory) and nothing is exec'd; it touches no lock, connection or thread of the console's, and leaves
with `os._exit`. The parent then walks the result itself through file descriptors, never following a
link: it checks again that there are only regular files and folders within the limits, gives each to
the console's own account with the modes above, and only then moves it into place. When the console
does not run as root the child keeps the console's account: there is no privilege to drop.
"""

import contextlib
import errno
import json
import os
import pwd
import re
import resource
import select
import shutil
import signal
import stat
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction

from .models import CodeDirectory

# A code directory's name: a folder's name here and on the nodes, and a word in the job's command line.
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Below this many unpacked bytes the compression ratio is not looked at: small files of zeros are not bombs.
RATIO_APPLIES_ABOVE = 64 * 1024**2
FILE_MODE, EXECUTABLE_MODE, FOLDER_MODE = 0o644, 0o755, 0o755
CHUNK = 1024 * 1024
MAX_NAME_BYTES = 255
NOT_PLAIN = "only plain files and folders are allowed"


class ArchiveRejected(ValueError):
    """Why an upload was refused; `field` is the form field the message belongs to: "archive" or "name"."""

    def __init__(self, message: str, field: str = "archive"):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Limits:
    upload_bytes: int
    unpacked_bytes: int
    files: int
    folders: int
    depth: int
    ratio: int

    @classmethod
    def from_settings(cls) -> "Limits":
        return cls(
            upload_bytes=settings.CODE_DIR_MAX_UPLOAD_BYTES,
            unpacked_bytes=settings.CODE_DIR_MAX_UNPACKED_BYTES,
            files=settings.CODE_DIR_MAX_FILES,
            folders=settings.CODE_DIR_MAX_FOLDERS,
            depth=settings.CODE_DIR_MAX_DEPTH,
            ratio=settings.CODE_DIR_MAX_COMPRESSION_RATIO,
        )


@dataclass(frozen=True)
class Unpacked:
    """What an accepted archive became: counted by the console after the unpacking, not taken from the archive."""

    files: int
    bytes: int
    folders: int
    unpacked_by: tuple[int, int]  # the (uid, gid) the writing ran as


def _human(count: int) -> str:
    """ " (5 GiB)" after a count of bytes, for counts of a KiB or more."""
    units = ["KiB", "MiB", "GiB", "TiB"]
    size, unit = count / 1024, units.pop(0)
    while size >= 1024 and units:
        size, unit = size / 1024, units.pop(0)
    return "" if count < 1024 else f" ({size:.1f}".removesuffix(".0") + f" {unit})"


def upload_size_refusal(size: int, limit: int) -> str:
    return f"the upload is {size} bytes{_human(size)}; at most {limit} bytes{_human(limit)} may be uploaded"


# Reading the archive: every member checked before anything is written ------------------------------


@dataclass(frozen=True)
class _Item:
    parts: tuple[str, ...]
    is_dir: bool
    executable: bool
    ref: Any  # the member's zipfile.ZipInfo or tarfile.TarInfo

    @property
    def path(self) -> str:
        return "/".join(self.parts)


def _declared_size(ref: Any) -> int:
    return ref.file_size if isinstance(ref, zipfile.ZipInfo) else ref.size


def _parts(name: str) -> tuple[str, ...]:
    if "\x00" in name:
        raise ArchiveRejected(f"{name!r} has a NUL character in its name")
    text = name.replace("\\", "/")
    if text.startswith("/"):
        raise ArchiveRejected(f"{name!r} is an absolute path: it would be written outside the code directory")
    parts = tuple(part for part in text.split("/") if part not in ("", "."))
    if ".." in parts:
        raise ArchiveRejected(f"{name!r} has '..' in its path: it would be written outside the code directory")
    for part in parts:
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise ArchiveRejected(f"{name!r} has a name longer than {MAX_NAME_BYTES} bytes")
    return parts


def _links_refused(path: str, kind: str, target: str | None = None) -> ArchiveRejected:
    to = f" (to {target!r})" if target is not None else ""
    return ArchiveRejected(
        f"{path} is a {kind} link{to}: links are refused, whether they point inside or outside the code directory; "
        "a code directory holds only plain files and folders, as on the reference platform")


class _Budget:
    """The unpacked bytes an archive may have: the absolute limit, and the bomb limit its own size sets."""

    def __init__(self, limits: Limits, archive_size: int):
        self.limit = limits.unpacked_bytes
        self.ratio, self.archive_size = limits.ratio, archive_size
        self.bomb_limit = max(RATIO_APPLIES_ABOVE, limits.ratio * archive_size)
        self.written = 0

    def check_declared(self, total: int, *, complete: bool) -> None:
        said = f"{total} bytes" + ("" if complete else " or more")
        if total > self.limit:
            raise ArchiveRejected(f"the archive unpacks to {said}; at most {self.limit}{_human(self.limit)} are allowed")
        if total > self.bomb_limit:
            raise ArchiveRejected(self._bomb(said))

    def spend(self, count: int) -> None:
        """Counted while writing, whatever the headers said."""
        self.written += count
        if self.written > self.limit:
            raise ArchiveRejected(f"the archive unpacks to more than {self.limit} bytes; "
                                  f"at most {self.limit}{_human(self.limit)} are allowed")
        if self.written > self.bomb_limit:
            raise ArchiveRejected(self._bomb(f"more than {self.bomb_limit} bytes"))

    def _bomb(self, said: str) -> str:
        return (f"the archive unpacks to {said} from {self.archive_size} bytes: more than {self.ratio} times its size, "
                "which is refused as a compression bomb")


@dataclass
class _Plan:
    """The members in order, with what the whole archive adds up to; limits checked as they are added."""

    limits: Limits
    budget: _Budget
    complete: bool  # True when every member is known before the checks (zip), False while streaming (tar)
    # One per member, in the archive's order; None for a member that writes nothing (the archive's own "./").
    items: list[_Item | None] = field(default_factory=list)
    kinds: dict[tuple[str, ...], str] = field(default_factory=dict)
    files: int = 0
    folders: int = 0
    declared: int = 0

    def _folder(self, parts: tuple[str, ...]) -> None:
        kind = self.kinds.get(parts)
        if kind == "file":
            raise ArchiveRejected(f"{'/'.join(parts)} is both a file and a folder in the archive")
        if kind is None:
            self.kinds[parts] = "folder"
            self.folders += 1
            if len(parts) > self.limits.depth:
                raise ArchiveRejected(f"{'/'.join(parts)} is {len(parts)} levels deep; "
                                      f"at most {self.limits.depth} are allowed")
            if not self.complete:
                self._check_folders()

    def _check_folders(self) -> None:
        if self.folders > self.limits.folders:
            more = "" if self.complete else " or more"
            raise ArchiveRejected(f"the archive holds {self.folders} folders{more}; "
                                  f"at most {self.limits.folders} are allowed")

    def _check_files(self) -> None:
        if self.files > self.limits.files:
            more = "" if self.complete else " or more"
            raise ArchiveRejected(f"the archive holds {self.files} files{more}; at most {self.limits.files} are allowed")

    def add(self, name: str, is_dir: bool, executable: bool, ref: Any) -> None:
        # Members beyond every file and folder allowed: a folder given over and over is no reason to read on.
        if len(self.items) >= self.limits.files + self.limits.folders + 16:
            raise ArchiveRejected(f"the archive has more than {len(self.items)} members; at most {self.limits.files} files "
                                  f"and {self.limits.folders} folders are allowed")
        parts = _parts(name)
        if not parts:
            if is_dir:
                self.items.append(None)  # the archive's own top, "./"
                return
            raise ArchiveRejected(f"{name!r} is a file with no name")
        for end in range(1, len(parts)):
            self._folder(parts[:end])
        if is_dir:
            self._folder(parts)
        else:
            kind = self.kinds.get(parts)
            if kind == "folder":
                raise ArchiveRejected(f"{'/'.join(parts)} is both a file and a folder in the archive")
            if kind == "file":
                raise ArchiveRejected(f"{'/'.join(parts)} is given twice in the archive")
            self.kinds[parts] = "file"
            self.files += 1
            self.declared += _declared_size(ref)
            if not self.complete:
                self._check_files()
                self.budget.check_declared(self.declared, complete=False)
        self.items.append(_Item(parts, is_dir, executable, ref))

    def finish(self) -> None:
        if not self.files:
            raise ArchiveRejected("the archive holds no file")
        self._check_files()
        self._check_folders()
        self.budget.check_declared(self.declared, complete=self.complete)


def _zip_plan(archive: zipfile.ZipFile, plan: _Plan) -> None:
    for info in archive.infolist():
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        path = info.filename
        if kind == stat.S_IFLNK:
            raise _links_refused(path, "symbolic")
        if kind in (stat.S_IFCHR, stat.S_IFBLK):
            raise ArchiveRejected(f"{path} is a device file: {NOT_PLAIN}")
        if kind == stat.S_IFIFO:
            raise ArchiveRejected(f"{path} is a fifo (a named pipe): {NOT_PLAIN}")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise ArchiveRejected(f"{path} is not a plain file or folder: {NOT_PLAIN}")
        if info.flag_bits & 0x1:
            raise ArchiveRejected(f"{path} is encrypted; upload the archive without a password")
        plan.add(path, info.is_dir() or kind == stat.S_IFDIR, bool(mode & 0o111), info)


def _tar_plan(archive: tarfile.TarFile, plan: _Plan) -> None:
    for info in archive:
        path = info.name
        if info.issym():
            raise _links_refused(path, "symbolic", info.linkname)
        if info.islnk():
            raise _links_refused(path, "hard", info.linkname)
        if info.ischr() or info.isblk():
            raise ArchiveRejected(f"{path} is a device file: {NOT_PLAIN}")
        if info.isfifo():
            raise ArchiveRejected(f"{path} is a fifo (a named pipe): {NOT_PLAIN}")
        if not (info.isreg() or info.isdir()):
            raise ArchiveRejected(f"{path} is not a plain file or folder: {NOT_PLAIN}")
        plan.add(path, info.isdir(), bool(info.mode & 0o111), info)


def _tar_stream(source: IO[bytes]) -> tarfile.TarFile:
    source.seek(0)
    try:
        return tarfile.open(fileobj=source, mode="r|*")
    except tarfile.TarError:
        raise ArchiveRejected("the file is neither a .zip nor a .tar.gz archive") from None


# Writing, relative to directory file descriptors ----------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_folder(root_fd: int, parts: tuple[str, ...]) -> int:
    """The folder at parts under root_fd, made where missing; never through a link."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                os.mkdir(part, FOLDER_MODE, dir_fd=fd)
            except FileExistsError:
                pass
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_member(root_fd: int, item: _Item, data: IO[bytes] | None, budget: _Budget) -> None:
    if item.is_dir:
        try:
            fd = _open_folder(root_fd, item.parts)
        except OSError as error:
            raise _unwritable(item, error) from None
        try:
            os.fchmod(fd, FOLDER_MODE)
        finally:
            os.close(fd)
        return
    assert data is not None
    try:
        folder = _open_folder(root_fd, item.parts[:-1])
        try:
            fd = os.open(item.parts[-1], _NEW_FILE_FLAGS, FILE_MODE, dir_fd=folder)
        finally:
            os.close(folder)
    except OSError as error:
        raise _unwritable(item, error) from None
    try:
        while chunk := data.read(CHUNK):  # a damaged archive fails here, in the reading
            budget.spend(len(chunk))
            view = memoryview(chunk)
            try:
                while view:
                    view = view[os.write(fd, view):]
            except OSError as error:
                raise _unwritable(item, error) from None
        os.fchmod(fd, EXECUTABLE_MODE if item.executable else FILE_MODE)
    finally:
        os.close(fd)


def _unwritable(item: _Item, error: OSError) -> ArchiveRejected:
    if error.errno == errno.EFBIG:
        return ArchiveRejected(f"{item.path} is larger than the unpacked size allowed")
    return ArchiveRejected(f"{item.path} could not be written ({error.strerror or error})")


def _write_all(source: IO[bytes], root_fd: int, limits: Limits, archive_size: int) -> None:
    """Check every member, then write them all. Runs in the child."""
    budget = _Budget(limits, archive_size)
    source.seek(0)
    if zipfile.is_zipfile(source):
        source.seek(0)
        with zipfile.ZipFile(source) as archive:
            plan = _Plan(limits, budget, complete=True)
            _zip_plan(archive, plan)
            plan.finish()
            for item in plan.items:
                if item is None:
                    continue
                if item.is_dir:
                    _write_member(root_fd, item, None, budget)
                else:
                    with archive.open(item.ref) as data:
                        _write_member(root_fd, item, data, budget)
        return
    plan = _Plan(limits, budget, complete=False)
    with _tar_stream(source) as archive:
        _tar_plan(archive, plan)
    plan.finish()
    # A second pass over the stream, now that the whole archive is known to be acceptable.
    with _tar_stream(source) as archive:
        for info, item in zip(archive, plan.items, strict=True):
            if item is None:
                continue
            if info.name != item.ref.name:
                raise ArchiveRejected("the archive changed between two readings")
            _write_member(root_fd, item, None if item.is_dir else archive.extractfile(info), budget)


def _damaged(error: BaseException) -> ArchiveRejected:
    detail = str(error) or type(error).__name__
    return ArchiveRejected(f"the archive is damaged or truncated and cannot be read ({detail})")


# The child: unprivileged, limited, talking back through a pipe ---------------------------------------


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


def _child(source: IO[bytes], root_fd: int, limits: Limits, archive_size: int, account: tuple[int, int] | None) -> dict:
    os.chdir("/")
    # A file past the limit then fails with EFBIG instead of killing the child.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    file_limit = min(limits.unpacked_bytes, max(RATIO_APPLIES_ABOVE, limits.ratio * archive_size))
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY:
        file_limit = min(file_limit, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if account is not None:
        uid, gid = account
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if 0 in os.getresuid() or 0 in os.getresgid() or os.getgroups():
            raise RuntimeError("the unpacking process kept a privilege")
    try:
        _write_all(source, root_fd, limits, archive_size)
    except ArchiveRejected:
        raise
    except Exception as error:  # noqa: BLE001 - zipfile, tarfile, gzip, zlib and lzma each raise their own kinds on a bad archive
        raise _damaged(error) from None
    return {"unpacked_by": [os.geteuid(), os.getegid()]}


def _answer_of(pid: int, read_end: int) -> tuple[bytearray, int]:
    """What the child wrote, and its wait status, once it has exited; killed past the timeout.

    The end of the child is told by waitpid, not by the pipe's end alone: a child forked meanwhile for
    another upload holds a copy of this pipe's writing end until it exits itself.
    """
    received, status, reaped = bytearray(), 0, False
    deadline = time.monotonic() + settings.CODE_DIR_UNPACK_TIMEOUT_SECONDS
    # poll, not select: select refuses descriptors past 1023, which a busy web process has.
    watcher = select.poll()
    watcher.register(read_end, select.POLLIN | select.POLLHUP)
    try:
        while not reaped:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ArchiveRejected(f"unpacking the archive took longer than "
                                      f"{settings.CODE_DIR_UNPACK_TIMEOUT_SECONDS} seconds")
            ready = watcher.poll(int(min(remaining, 0.2) * 1000))
            chunk = os.read(read_end, 65536) if ready else b""
            received += chunk
            if len(received) > 1024 * 1024:
                raise ArchiveRejected("the unpacking process said too much")
            if not chunk:  # the pipe is quiet or closed: has the child exited?
                done, status = os.waitpid(pid, os.WNOHANG)
                reaped = done == pid
        os.set_blocking(read_end, False)
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read_end, 65536):
                received += chunk
    finally:
        os.close(read_end)
        if not reaped:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return received, status


def _run_child(source: IO[bytes], root_fd: int, limits: Limits, archive_size: int,
               account: tuple[int, int] | None) -> tuple[int, int]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_end)
            try:
                answer = _child(source, root_fd, limits, archive_size, account)
                code = 0
            except ArchiveRejected as refusal:
                answer = {"refused": str(refusal)}
            except BaseException as error:  # noqa: B036, BLE001 - whatever happens, the child answers and exits here
                answer = {"failed": f"{type(error).__name__}: {error}"}
            payload = memoryview(json.dumps(answer).encode())
            while payload:
                payload = payload[os.write(write_end, payload):]
        finally:
            os._exit(code)
    os.close(write_end)
    received, status = _answer_of(pid, read_end)
    try:
        answer = json.loads(received)
    except ValueError:
        ended = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"status {os.waitstatus_to_exitcode(status)}"
        raise ArchiveRejected(f"the archive could not be unpacked (the unpacking process ended with {ended})") from None
    if "refused" in answer:
        raise ArchiveRejected(answer["refused"])
    if "failed" in answer or status != 0:
        raise RuntimeError(f"unpacking the archive failed: {answer.get('failed', status)}")
    uid, gid = answer["unpacked_by"]
    return uid, gid


# The console's own look at the result, and moving it into place --------------------------------------


@dataclass
class _Count:
    files: int = 0
    bytes: int = 0
    folders: int = 0


def _settle(folder_fd: int, path: str, depth: int, count: _Count, limits: Limits, owner: tuple[int, int] | None) -> None:
    """Check and own everything under folder_fd: regular files and folders only, within the limits; never a link followed."""
    with os.scandir(folder_fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        where = f"{path}/{name}" if path else name
        before = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        if stat.S_ISDIR(before.st_mode):
            count.folders += 1
            if count.folders > limits.folders or depth + 1 > limits.depth:
                raise ArchiveRejected(f"the archive holds more folders, or deeper ones, than allowed ({where})")
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
                    raise ArchiveRejected(f"{where} is a hard link: {NOT_PLAIN}")
                count.files += 1
                count.bytes += now.st_size
                if count.files > limits.files or count.bytes > limits.unpacked_bytes:
                    raise ArchiveRejected(f"the archive holds more files or bytes than allowed ({where})")
                _own(fd, before, EXECUTABLE_MODE if before.st_mode & 0o111 else FILE_MODE, owner, where)
            finally:
                os.close(fd)
        else:
            raise ArchiveRejected(f"{where} is not a plain file or folder: {NOT_PLAIN}")


def _own(fd: int, seen: os.stat_result, mode: int, owner: tuple[int, int] | None, where: str) -> None:
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino) or stat.S_IFMT(now.st_mode) != stat.S_IFMT(seen.st_mode):
        raise ArchiveRejected(f"{where} changed while it was being checked")
    if owner is not None:
        os.fchown(fd, *owner)
    os.fchmod(fd, mode)


def unpack(archive: Path | IO[bytes], destination: Path, limits: Limits | None = None) -> Unpacked:
    """Unpack an archive into destination, which must not exist yet; all of it, or nothing (ArchiveRejected).

    An archive of a single folder (`gpu-train/...`) holds the code directory itself: that folder becomes
    destination.
    """
    limits = limits or Limits.from_settings()
    if os.path.lexists(destination):
        raise FileExistsError(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    account = _unpack_account()
    opened = open(archive, "rb") if isinstance(archive, Path) else contextlib.nullcontext(archive)
    with opened as source:
        archive_size = source.seek(0, os.SEEK_END)
        if archive_size > limits.upload_bytes:
            raise ArchiveRejected(upload_size_refusal(archive_size, limits.upload_bytes))
        scratch = Path(tempfile.mkdtemp(prefix=".unpack-", dir=destination.parent))
        try:
            unpacked = scratch / "unpacked"
            unpacked.mkdir(mode=0o700)
            root_fd = os.open(unpacked, _DIR_FLAGS)
            try:
                if account is not None:
                    os.fchown(root_fd, *account)  # the unprivileged child's to write in, and nothing above it
                os.fchmod(root_fd, 0o700)
                unpacked_by = _run_child(source, root_fd, limits, archive_size, account)
                owner = (os.geteuid(), os.getegid()) if account is not None else None
                count = _Count()
                _own(root_fd, os.fstat(root_fd), FOLDER_MODE, owner, ".")
                _settle(root_fd, "", 0, count, limits, owner)
            finally:
                os.close(root_fd)
            if not count.files:
                raise ArchiveRejected("the archive holds no file")
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
    problem = name_refusal(name, owner)
    if problem:
        raise ArchiveRejected(problem, field="name")
    if sharing not in CodeDirectory.Sharing.values:
        raise ArchiveRejected(f"Choose one of {', '.join(CodeDirectory.Sharing.values)}.", field="sharing")
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
    return ArchiveRejected(f"You already have a code directory named {name!r}; choose another name.", field="name")


def name_refusal(name: str, owner=None) -> str | None:
    """What is wrong with a new code directory's name, or None: its form, and that the owner has none of that
    name (other users' names are theirs to reuse and are never revealed)."""
    if not NAME_RE.fullmatch(name or ""):
        return "Use 1 to 64 letters, digits, '-' or '_'."
    if CodeDirectory.objects.filter(name=name, owner=owner).exists():
        return str(_name_taken(name))
    return None


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
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
        for filename in sorted(filenames):
            if filename.endswith(".py"):
                found.append(str(Path(dirpath, filename).relative_to(root)))
                if len(found) >= limit:
                    return found
    return found
