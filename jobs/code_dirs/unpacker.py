"""The unpacker: a process of its own (`python -m jobs.code_dirs.unpacker REQUEST`) that writes an accepted
archive into a folder it is handed as a file descriptor, never through a path.

It starts as the console's account, with only the standard library and jobs.code_dirs.policy loaded
(no Django, no lock, connection or thread of the console's), then, when the console runs as root, drops
to the unprivileged account it is given (`setgroups([])`, `setgid`, `setuid`, and a check that no root id
is left) before it reads a byte of the archive. Its `RLIMIT_FSIZE` caps any file at the unpacked-size limit.
It answers one JSON object on stdout: {"unpacked_by": [uid, gid]}, {"refused": why, "words": ..., "params": ...}
(why in English, and the words and their values the console says in the page's language) or {"failed": what}.
Started by exec rather than forked from the web process: a fork of a process with threads copies only
the forking thread, and whatever lock another thread held stays held in the child.
"""

import errno
import json
import os
import resource
import signal
import sys
import zipfile
from typing import IO

from jobs.code_dirs.policy import (
    CHUNK,
    EXECUTABLE_MODE,
    FILE_MODE,
    FOLDER_MODE,
    RATIO_APPLIES_ABOVE,
    ArchiveRejected,
    Limits,
    _Budget,
    _damaged,
    _Item,
    _Plan,
    _tar_plan,
    _tar_stream,
    _zip_plan,
    gettext_noop,
)

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
        return ArchiveRejected(gettext_noop("%(path)s is larger than the unpacked size allowed"), {"path": item.path})
    return ArchiveRejected(gettext_noop("%(path)s could not be written (%(reason)s)"),
                           {"path": item.path, "reason": str(error.strerror or error)})


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
                raise ArchiveRejected(gettext_noop("the archive changed between two readings"))
            _write_member(root_fd, item, None if item.is_dir else archive.extractfile(info), budget)


def _drop_privileges(account: tuple[int, int] | None, limits: Limits, archive_size: int) -> None:
    os.chdir("/")
    # A file past the limit then fails with EFBIG instead of killing the process.
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


def unpack_into(archive_fd: int, root_fd: int, limits: Limits, archive_size: int,
                account: tuple[int, int] | None) -> dict:
    """What the process does: drop its privileges, then check and write the archive."""
    _drop_privileges(account, limits, archive_size)
    source = os.fdopen(archive_fd, "rb", closefd=False)
    try:
        _write_all(source, root_fd, limits, archive_size)
    except ArchiveRejected:
        raise
    except Exception as error:  # noqa: BLE001 - zipfile, tarfile, gzip, zlib and lzma each raise their own kinds on a bad archive
        raise _damaged(error) from None
    return {"unpacked_by": [os.geteuid(), os.getegid()]}


def main(request_text: str) -> int:
    try:
        request = json.loads(request_text)
        account = tuple(request["account"]) if request["account"] is not None else None
        answer = unpack_into(request["archive_fd"], request["root_fd"], Limits(**request["limits"]),
                             request["archive_size"], account)
        code = 0
    except ArchiveRejected as refusal:
        answer, code = {"refused": str(refusal), "words": refusal.words, "params": refusal.params}, 1
    except BaseException as error:  # noqa: B036, BLE001 - whatever happens, the process answers and exits here
        answer, code = {"failed": f"{type(error).__name__}: {error}"}, 1
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
