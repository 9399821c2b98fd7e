"""What an uploaded archive may hold, checked member by member before anything is written: plain files and
folders only, paths that stay inside, and the limits (`Limits`). Plain Python: the unpacker process
(jobs.code_dirs.unpacker) runs it without Django."""

import os
import re
import stat
import tarfile
import zipfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import IO, Any

# A code directory's name: a folder's name here and on the nodes, and a word in the job's command line.
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Below this many unpacked bytes the compression ratio is not looked at: small files of zeros are not bombs.
RATIO_APPLIES_ABOVE = 64 * 1024**2
FILE_MODE, EXECUTABLE_MODE, FOLDER_MODE = 0o644, 0o755, 0o755
CHUNK = 1024 * 1024
MAX_NAME_BYTES = 255
# What a terminal takes for a command, never for part of a name: the C0 controls (ESC among them), DEL and the
# C1 controls, as characters or, in a tar's name that is not UTF-8, as the raw bytes 0x80-0x9f (NUL has its own
# refusal). Such a name would rewrite the screen of whoever lists the code directory or reads the job's log.
CONTROL_CHARACTERS = re.compile("[\x01-\x1f\x7f-\x9f\udc80-\udc9f]")


def gettext_noop(words: str) -> str:
    """Marks a refusal's words for the catalogue (makemessages finds them by this name); the console says them in
    the page's language (jobs.code_dirs.service.refusal_words), this process knowing no language."""
    return words


# A code directory is there to run a boot file: an archive with none anywhere is a mistake to say at once.
NO_FILE = gettext_noop("the archive holds no file")
NO_PYTHON_FILE = gettext_noop("the archive holds no Python file to boot (no .py file in any of its folders)")


class ArchiveRejected(ValueError):
    """Why an upload was refused: `words` with its `params` (%(name)s placeholders), str() in English; `field` is
    the form field the message belongs to: "archive" or "name"."""

    def __init__(self, words: str, params: Mapping[str, str | int] | None = None, field: str = "archive"):
        self.words = words
        self.params: dict[str, str | int] = dict(params or {})
        super().__init__(words % self.params if self.params else words)
        self.field = field


@dataclass(frozen=True)
class Limits:
    upload_bytes: int
    unpacked_bytes: int
    files: int
    folders: int
    depth: int
    ratio: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)



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


def upload_size_refusal(size: int, limit: int) -> ArchiveRejected:
    return ArchiveRejected(gettext_noop("the upload is %(size)s bytes%(size_in_units)s; at most %(limit)s "
                                        "bytes%(limit_in_units)s may be uploaded"),
                           {"size": size, "size_in_units": _human(size), "limit": limit, "limit_in_units": _human(limit)})


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
        raise ArchiveRejected(gettext_noop("%(path)s has a NUL character in its name"), {"path": repr(name)})
    if CONTROL_CHARACTERS.search(name):
        raise control_characters_refused(name)
    text = name.replace("\\", "/")
    if text.startswith("/"):
        raise ArchiveRejected(gettext_noop("%(path)s is an absolute path: it would be written outside the code directory"),
                              {"path": repr(name)})
    parts = tuple(part for part in text.split("/") if part not in ("", "."))
    if ".." in parts:
        raise ArchiveRejected(gettext_noop("%(path)s has '..' in its path: it would be written outside the code directory"),
                              {"path": repr(name)})
    for part in parts:
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise ArchiveRejected(gettext_noop("%(path)s has a name longer than %(max)s bytes"),
                                  {"path": repr(name), "max": MAX_NAME_BYTES})
    return parts


def control_characters_refused(path: str) -> ArchiveRejected:
    """The refusal of a name with control characters, the name shown escaped (ESC as \\x1b), never as it is."""
    return ArchiveRejected(gettext_noop("%(path)s has a control character in its name (an escape sequence, a tab or a "
                                        "line break): rename it and upload again"), {"path": repr(path)})


def _links_refused(path: str, kind: str, target: str | None = None) -> ArchiveRejected:
    if target is None:
        words = gettext_noop("%(path)s is a symbolic link: links are refused, whether they point inside or outside the "
                             "code directory; a code directory holds only plain files and folders, as on the reference "
                             "platform")
    elif kind == "symbolic":
        words = gettext_noop("%(path)s is a symbolic link (to %(target)s): links are refused, whether they point inside "
                             "or outside the code directory; a code directory holds only plain files and folders, as on "
                             "the reference platform")
    else:
        words = gettext_noop("%(path)s is a hard link (to %(target)s): links are refused, whether they point inside or "
                             "outside the code directory; a code directory holds only plain files and folders, as on the "
                             "reference platform")
    return ArchiveRejected(words, {"path": path, "target": repr(target)})


def not_plain_refused(path: str, kind: str) -> ArchiveRejected:
    """The refusal of a member that is no plain file or folder: a "device" file, a "fifo", a "hard" link, or "other"."""
    words = {
        "device": gettext_noop("%(path)s is a device file: only plain files and folders are allowed"),
        "fifo": gettext_noop("%(path)s is a fifo (a named pipe): only plain files and folders are allowed"),
        "hard": gettext_noop("%(path)s is a hard link: only plain files and folders are allowed"),
    }.get(kind, gettext_noop("%(path)s is not a plain file or folder: only plain files and folders are allowed"))
    return ArchiveRejected(words, {"path": path})


class _Budget:
    """The unpacked bytes an archive may have: the absolute limit, and the bomb limit its own size sets."""

    def __init__(self, limits: Limits, archive_size: int):
        self.limit = limits.unpacked_bytes
        self.ratio, self.archive_size = limits.ratio, archive_size
        self.bomb_limit = max(RATIO_APPLIES_ABOVE, limits.ratio * archive_size)
        self.written = 0

    def check_declared(self, total: int, *, complete: bool) -> None:
        if total > self.limit:
            raise ArchiveRejected(
                gettext_noop("the archive unpacks to %(total)s bytes; at most %(limit)s%(limit_in_units)s are allowed")
                if complete else
                gettext_noop("the archive unpacks to %(total)s bytes or more; at most %(limit)s%(limit_in_units)s are "
                             "allowed"),
                {"total": total, "limit": self.limit, "limit_in_units": _human(self.limit)})
        if total > self.bomb_limit:
            raise self._bomb(total, "exactly" if complete else "at least")

    def spend(self, count: int) -> None:
        """Counted while writing, whatever the headers said."""
        self.written += count
        if self.written > self.limit:
            raise ArchiveRejected(gettext_noop("the archive unpacks to more than %(limit)s bytes; at most "
                                               "%(limit)s%(limit_in_units)s are allowed"),
                                  {"limit": self.limit, "limit_in_units": _human(self.limit)})
        if self.written > self.bomb_limit:
            raise self._bomb(self.bomb_limit, "more than")

    def _bomb(self, total: int, how: str) -> ArchiveRejected:
        words = {
            "exactly": gettext_noop("the archive unpacks to %(total)s bytes from %(size)s bytes: more than %(ratio)s "
                                    "times its size, which is refused as a compression bomb"),
            "at least": gettext_noop("the archive unpacks to %(total)s bytes or more from %(size)s bytes: more than "
                                     "%(ratio)s times its size, which is refused as a compression bomb"),
        }.get(how, gettext_noop("the archive unpacks to more than %(total)s bytes from %(size)s bytes: more than "
                                "%(ratio)s times its size, which is refused as a compression bomb"))
        return ArchiveRejected(words, {"total": total, "size": self.archive_size, "ratio": self.ratio})


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
    python_files: int = 0

    def _folder(self, parts: tuple[str, ...]) -> None:
        kind = self.kinds.get(parts)
        if kind == "file":
            raise _file_and_folder(parts)
        if kind is None:
            self.kinds[parts] = "folder"
            self.folders += 1
            if len(parts) > self.limits.depth:
                raise ArchiveRejected(gettext_noop("%(path)s is %(depth)s levels deep; at most %(max)s are allowed"),
                                      {"path": "/".join(parts), "depth": len(parts), "max": self.limits.depth})
            if not self.complete:
                self._check_folders()

    def _check_folders(self) -> None:
        if self.folders > self.limits.folders:
            raise ArchiveRejected(
                gettext_noop("the archive holds %(count)s folders; at most %(max)s are allowed") if self.complete
                else gettext_noop("the archive holds %(count)s folders or more; at most %(max)s are allowed"),
                {"count": self.folders, "max": self.limits.folders})

    def _check_files(self) -> None:
        if self.files > self.limits.files:
            raise ArchiveRejected(
                gettext_noop("the archive holds %(count)s files; at most %(max)s are allowed") if self.complete
                else gettext_noop("the archive holds %(count)s files or more; at most %(max)s are allowed"),
                {"count": self.files, "max": self.limits.files})

    def add(self, name: str, is_dir: bool, executable: bool, ref: Any) -> None:
        # Members beyond every file and folder allowed: a folder given over and over is no reason to read on.
        if len(self.items) >= self.limits.files + self.limits.folders + 16:
            raise ArchiveRejected(gettext_noop("the archive has more than %(count)s members; at most %(files)s files and "
                                               "%(folders)s folders are allowed"),
                                  {"count": len(self.items), "files": self.limits.files, "folders": self.limits.folders})
        parts = _parts(name)
        if not parts:
            if is_dir:
                self.items.append(None)  # the archive's own top, "./"
                return
            raise ArchiveRejected(gettext_noop("%(path)s is a file with no name"), {"path": repr(name)})
        for end in range(1, len(parts)):
            self._folder(parts[:end])
        if is_dir:
            self._folder(parts)
        else:
            kind = self.kinds.get(parts)
            if kind == "folder":
                raise _file_and_folder(parts)
            if kind == "file":
                raise ArchiveRejected(gettext_noop("%(path)s is given twice in the archive"), {"path": "/".join(parts)})
            self.kinds[parts] = "file"
            self.files += 1
            self.python_files += parts[-1].endswith(".py")
            self.declared += _declared_size(ref)
            if not self.complete:
                self._check_files()
                self.budget.check_declared(self.declared, complete=False)
        self.items.append(_Item(parts, is_dir, executable, ref))

    def finish(self) -> None:
        if not self.files:
            raise ArchiveRejected(NO_FILE)
        self._check_files()
        self._check_folders()
        self.budget.check_declared(self.declared, complete=self.complete)
        if not self.python_files:  # after the limits: a bomb is said to be one, whatever it holds
            raise ArchiveRejected(NO_PYTHON_FILE)


def _file_and_folder(parts: tuple[str, ...]) -> ArchiveRejected:
    return ArchiveRejected(gettext_noop("%(path)s is both a file and a folder in the archive"), {"path": "/".join(parts)})


def _zip_plan(archive: zipfile.ZipFile, plan: _Plan) -> None:
    for info in archive.infolist():
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        path = info.filename
        if kind == stat.S_IFLNK:
            raise _links_refused(path, "symbolic")
        if kind in (stat.S_IFCHR, stat.S_IFBLK):
            raise not_plain_refused(path, "device")
        if kind == stat.S_IFIFO:
            raise not_plain_refused(path, "fifo")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise not_plain_refused(path, "other")
        if info.flag_bits & 0x1:
            raise ArchiveRejected(gettext_noop("%(path)s is encrypted; upload the archive without a password"), {"path": path})
        plan.add(path, info.is_dir() or kind == stat.S_IFDIR, bool(mode & 0o111), info)


def _tar_plan(archive: tarfile.TarFile, plan: _Plan) -> None:
    for info in archive:
        path = info.name
        if info.issym():
            raise _links_refused(path, "symbolic", info.linkname)
        if info.islnk():
            raise _links_refused(path, "hard", info.linkname)
        if info.ischr() or info.isblk():
            raise not_plain_refused(path, "device")
        if info.isfifo():
            raise not_plain_refused(path, "fifo")
        if not (info.isreg() or info.isdir()):
            raise not_plain_refused(path, "other")
        plan.add(path, info.isdir(), bool(info.mode & 0o111), info)


def _tar_stream(source: IO[bytes]) -> tarfile.TarFile:
    source.seek(0)
    try:
        return tarfile.open(fileobj=source, mode="r|*")
    except tarfile.TarError:
        raise ArchiveRejected(gettext_noop("the file is neither a .zip nor a .tar.gz archive")) from None


def _damaged(error: BaseException) -> ArchiveRejected:
    detail = str(error) or type(error).__name__
    return ArchiveRejected(gettext_noop("the archive is damaged or truncated and cannot be read (%(detail)s)"),
                           {"detail": detail})
