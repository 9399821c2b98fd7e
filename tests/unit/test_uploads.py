"""Uploaded archives (jobs.code_dirs): nothing is written outside the code directory, as anyone, with any privilege.

Each archive here is built by hand, member by member, the way an attacker would; the console must
refuse it with a field error that says why and leave nothing behind, or unpack it into plain files
and folders that belong to the console with ordinary modes.
"""

import io
import os
import pwd
import stat
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from jobs.code_dirs import service, unpacker
from jobs.code_dirs.policy import Limits
from jobs.code_dirs.service import ArchiveRejected, create_from_archive
from jobs.models import CodeDirectory
from tests.fixtures import api_client

pytestmark = pytest.mark.django_db

MARKER = "escaped-by-the-upload-test"
MiB = 1024 * 1024


@pytest.fixture
def uploads(settings, tmp_path):
    """CODE_DIRS_ROOT a few folders down tmp_path, so that an escape lands inside tmp_path, where it can be seen."""
    settings.CODE_DIRS_ROOT = tmp_path / "a" / "b" / "c" / "code-dirs"
    return settings.CODE_DIRS_ROOT


def member(name: str, data: bytes = b"", *, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644,
           uid: int = 0, gid: int = 0) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.uid, info.gid = kind, link, mode, uid, gid
    info.uname = info.gname = "attacker"
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def tar_gz(*members, name: str = "code.tar.gz") -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    buffer.seek(0)
    buffer.name = name
    return buffer


def zip_of(*entries, name: str = "code.zip") -> io.BytesIO:
    """entries: (name, data) or (name, data, unix mode with its file type)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for entry in entries:
            info = zipfile.ZipInfo(entry[0])
            info.create_system = 3
            info.external_attr = (entry[2] if len(entry) > 2 else stat.S_IFREG | 0o644) << 16
            archive.writestr(info, entry[1])
    buffer.seek(0)
    buffer.name = name
    return buffer


def upload(user, archive: io.BytesIO, name: str = "mycode", **fields):
    return api_client(user).post("/api/v1/code-dirs", {"name": name, "archive": archive, **fields}, format="multipart")


def refusal(response) -> str:
    assert response.status_code == 400, (response.status_code, response.content)
    body = response.json()
    assert list(body) == ["archive"], body
    return body["archive"][0]


def escaped(tmp_path: Path) -> list[Path]:
    """Every file the test planted that is not inside an accepted code directory."""
    found = [path for path in tmp_path.rglob(MARKER)]
    for path in found:
        path.unlink()
    return found


def nothing_left(root: Path) -> bool:
    """No code directory recorded, and nothing on disk but the (empty) folders of each owner's directories."""
    owner_folders = list(root.iterdir()) if root.exists() else []
    return not CodeDirectory.objects.exists() and all(
        folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()) for folder in owner_folders)


# Links, and what is written through them ------------------------------------------------------------


def test_a_chain_of_links_that_passes_a_lexical_check_writes_nothing_outside_the_code_directory(owner, uploads, tmp_path):
    archive = tar_gz(
        member("s", kind=tarfile.SYMTYPE, link="."),
        member("s/s/s/s/s/esc", kind=tarfile.SYMTYPE, link="../../../../.."),
        member(f"s/s/s/s/s/esc/{MARKER}", b"#!/bin/sh\nid\n", mode=0o4755, uid=4242, gid=4242),
    )

    message = refusal(upload(owner, archive))

    assert "link" in message and "plain files" in message
    assert escaped(tmp_path) == []
    assert nothing_left(uploads)


def test_a_file_written_through_a_link_to_a_folder_outside_is_refused_and_nothing_lands_there(owner, uploads, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = tar_gz(member("code/out", kind=tarfile.SYMTYPE, link=str(outside)), member(f"code/out/{MARKER}", b"x"))

    assert "link" in refusal(upload(owner, archive))
    assert list(outside.iterdir()) == []
    assert nothing_left(uploads)


def test_a_link_that_points_inside_the_code_directory_is_refused_too(owner, uploads):
    archive = tar_gz(member("code/train.py", b"print(1)\n"), member("code/alias.py", kind=tarfile.SYMTYPE, link="train.py"))

    assert "symbolic link" in refusal(upload(owner, archive))
    assert nothing_left(uploads)


@pytest.mark.parametrize("target", ["/etc/passwd", "code/train.py"])
def test_a_hardlink_is_refused_whatever_it_points_at(owner, uploads, target):
    archive = tar_gz(member("code/train.py", b"print(1)\n"), member("code/copy", kind=tarfile.LNKTYPE, link=target))

    assert "hard link" in refusal(upload(owner, archive))
    assert nothing_left(uploads)


def test_a_symbolic_link_in_a_zip_is_refused(owner, uploads):
    archive = zip_of(("code/train.py", "print(1)\n"), ("code/etc", "/etc", stat.S_IFLNK | 0o777))

    assert "symbolic link" in refusal(upload(owner, archive))
    assert nothing_left(uploads)


# Special files, owners and modes -------------------------------------------------------------------


@pytest.mark.parametrize("kind, word", [(tarfile.CHRTYPE, "device"), (tarfile.BLKTYPE, "device"), (tarfile.FIFOTYPE, "fifo")],
                         ids=["character-device", "block-device", "fifo"])
def test_a_device_file_or_a_fifo_is_refused(owner, uploads, kind, word):
    info, data = member("code/dev", kind=kind)
    info.devmajor, info.devminor = 1, 3  # /dev/null
    archive = tar_gz(member("code/train.py", b"print(1)\n"), (info, data))

    assert word in refusal(upload(owner, archive))
    assert nothing_left(uploads)


@pytest.mark.parametrize("mode", [stat.S_IFCHR | 0o666, stat.S_IFIFO | 0o644, stat.S_IFSOCK | 0o644],
                         ids=["device", "fifo", "socket"])
def test_a_special_file_in_a_zip_is_refused(owner, uploads, mode):
    archive = zip_of(("code/train.py", "print(1)\n"), ("code/odd", "", mode))

    assert "only plain files and folders" in refusal(upload(owner, archive))
    assert nothing_left(uploads)


def test_a_setuid_file_loses_the_bit_and_belongs_to_the_console_not_to_the_archives_owner(owner, uploads):
    archive = tar_gz(
        member("code", kind=tarfile.DIRTYPE, mode=0o7777, uid=4242, gid=4242),
        member("code/train.py", b"print(1)\n", mode=0o6755, uid=4242, gid=4242),
        member("code/data.txt", b"1 2 3\n", mode=0o1600, uid=4242, gid=4242),
        member("code/private.sh", b"id\n", mode=0o700, uid=4242, gid=4242),
    )

    response = upload(owner, archive)

    assert response.status_code == 201, response.content
    root = Path(CodeDirectory.objects.get(name="mycode").path)
    modes = {path.name: stat.S_IMODE(path.lstat().st_mode) for path in [root, *root.iterdir()]}
    assert modes == {"mycode": 0o755, "train.py": 0o755, "data.txt": 0o644, "private.sh": 0o755}
    for path in [root, *root.iterdir()]:
        assert (path.lstat().st_uid, path.lstat().st_gid) == (os.geteuid(), os.getegid()), path


def test_modes_of_a_zip_are_plain_too(owner, uploads):
    archive = zip_of(("code/run.sh", "id\n", stat.S_IFREG | 0o4711), ("code/x.py", "", stat.S_IFREG | 0o600), ("code/lib/", "", stat.S_IFDIR | 0o777))

    assert upload(owner, archive).status_code == 201
    root = Path(CodeDirectory.objects.get(name="mycode").path)
    assert {path.name: stat.S_IMODE(path.lstat().st_mode) for path in root.iterdir()} == {"run.sh": 0o755, "x.py": 0o644, "lib": 0o755}


@pytest.mark.skipif(os.geteuid() != 0, reason="only a console running as root drops privileges to unpack")
def test_a_console_running_as_root_unpacks_as_an_unprivileged_account_in_a_process_of_its_own(owner, uploads, settings):
    nobody = pwd.getpwnam(settings.CODE_DIR_UNPACK_USER)

    summary = service.unpack(tar_gz(member("code/train.py", b"print(1)\n")), uploads / "scratch")

    # What the unpacker process reported of itself once it had dropped its privileges, before it wrote.
    assert summary.unpacked_by == (nobody.pw_uid, nobody.pw_gid) != (os.geteuid(), os.getegid())
    assert (uploads / "scratch" / "train.py").stat().st_uid == os.geteuid(), "then given to the console's account"


# Paths --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["/tmp/" + MARKER, "//" + MARKER, "code/../../" + MARKER, "../" + MARKER, "code/..\\..\\" + MARKER])
def test_a_member_with_an_absolute_path_or_dot_dot_is_refused(owner, uploads, tmp_path, name):
    for archive in (tar_gz(member("code/train.py", b"1"), member(name, b"x")), zip_of(("code/train.py", "1"), (name, "x"))):
        message = refusal(upload(owner, archive))
        assert "outside the code directory" in message
        assert escaped(tmp_path) == [] and not Path("/tmp", MARKER).exists()
        assert nothing_left(uploads)


@pytest.mark.parametrize("name, shown", [
    ("code/evil\x1b[2J\x1b]0;owned\x07.py", "evil\\x1b[2J\\x1b]0;owned\\x07.py"),
    ("code/tab\there.py", "tab\\there.py"),
    ("code/del\x7f.py", "del\\x7f.py"),
    ("code/csi\x9b31m.py", "csi\\x9b31m.py"),
    ("code/sub\rdir/train.py", "sub\\rdir"),
], ids=["esc-and-bel", "tab", "del", "c1-csi", "folder"])
def test_a_name_with_terminal_control_characters_is_refused_naming_the_file_escaped(owner, uploads, name, shown):
    for archive in (tar_gz(member("code/train.py", b"1"), member(name, b"x")), zip_of(("code/train.py", "1"), (name, "x"))):
        message = refusal(upload(owner, archive))
        assert shown in message and "control character" in message, message
        assert not any(character in message for character in "\x1b\x07\t\r\x7f\x9b")
        assert nothing_left(uploads)


def test_a_tar_name_holding_a_raw_c1_byte_is_refused_too(owner, uploads):
    info, data = member("code/csi.py", b"x")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.USTAR_FORMAT, encoding="latin-1") as archive:
        archive.addfile(member("code/train.py", b"1")[0], io.BytesIO(b"1"))
        info.name = "code/csi\x9b31m.py"  # written as the single byte 0x9b: not UTF-8, read back as \udc9b
        archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)

    assert "control character" in refusal(upload(owner, buffer))
    assert nothing_left(uploads)


def test_a_file_named_with_control_characters_already_on_disk_is_not_offered_as_a_boot_file(tmp_path):
    from jobs.code_dirs.service import python_files, register

    (tmp_path / "train.py").write_text("")
    (tmp_path / "evil\x1b[2J.py").write_text("")
    (tmp_path / "dir\x9b").mkdir()
    (tmp_path / "dir\x9b" / "inner.py").write_text("")

    assert python_files(register("old", tmp_path)) == ["train.py"]


def test_a_member_given_twice_is_refused(owner, uploads):
    archive = tar_gz(member("code/train.py", b"1"), member("code/train.py", b"2"))

    assert "twice" in refusal(upload(owner, archive))
    assert nothing_left(uploads)


def test_a_path_that_is_both_a_file_and_a_folder_is_refused(owner, uploads):
    archive = zip_of(("code/lib", "x"), ("code/lib/util.py", "y"))

    assert "both a file and a folder" in refusal(upload(owner, archive))
    assert nothing_left(uploads)


def test_an_archive_of_one_folder_becomes_that_folder_and_others_are_kept_whole(owner, uploads):
    assert upload(owner, tar_gz(member("inner/train.py", b"1"), member("inner/lib/util.py", b"2")), name="one").status_code == 201
    assert upload(owner, zip_of(("train.py", "1"), ("lib/util.py", "2")), name="flat").status_code == 201

    one, flat = (CodeDirectory.objects.get(name=name) for name in ("one", "flat"))
    owners_folder = uploads / f"user-{owner.pk}"
    assert Path(one.path) == owners_folder / "one" and (owners_folder / "one" / "lib" / "util.py").read_text() == "2"
    assert sorted(p.name for p in Path(flat.path).iterdir()) == ["lib", "train.py"]
    assert (one.file_count, one.size_bytes) == (2, 2)
    assert sorted(path.name for path in owners_folder.iterdir()) == ["flat", "one"], "no scratch folder is left"
    assert [path.name for path in uploads.iterdir()] == [owners_folder.name]


def test_a_tar_made_of_its_folder_s_dot_keeps_its_files(owner, uploads):
    archive = tar_gz(member(".", kind=tarfile.DIRTYPE, mode=0o755), member("./train.py", b"1"), member("./lib", kind=tarfile.DIRTYPE),
                     member("./lib/util.py", b"2"))

    assert upload(owner, archive).status_code == 201
    assert sorted(path.name for path in (uploads / f"user-{owner.pk}" / "mycode").iterdir()) == ["lib", "train.py"]


# Limits -------------------------------------------------------------------------------------------


def test_an_upload_over_the_size_limit_is_refused_saying_the_limit(owner, uploads, settings):
    settings.CODE_DIR_MAX_UPLOAD_BYTES = 1000
    archive = zip_of(("code/train.py", os.urandom(4000)))

    message = refusal(upload(owner, archive))

    assert "at most 1000 bytes may be uploaded" in message
    assert nothing_left(uploads)


def test_an_archive_with_too_many_files_is_refused_saying_the_limit(owner, uploads, settings):
    settings.CODE_DIR_MAX_FILES = 3
    names = [f"code/f{index}.py" for index in range(5)]

    # A zip lists its members up front; a tar.gz is a stream, refused at the first member past the limit.
    assert "the archive holds 5 files; at most 3 are allowed" in refusal(upload(owner, zip_of(*((name, "") for name in names))))
    assert "holds 4 files or more; at most 3 are allowed" in refusal(upload(owner, tar_gz(*(member(name) for name in names))))
    assert nothing_left(uploads)


def test_the_default_limits_are_the_reference_platforms(settings):
    assert settings.CODE_DIR_MAX_FILES == 1000
    assert settings.CODE_DIR_MAX_UNPACKED_BYTES == 5 * 1024**3
    assert settings.CODE_DIR_MAX_UPLOAD_BYTES == 5 * 1024**3


def test_an_archive_that_unpacks_past_the_limit_is_refused_saying_the_limit(owner, uploads, settings):
    settings.CODE_DIR_MAX_UNPACKED_BYTES = 1000
    as_zip = zip_of(("code/a.py", b"x" * 600), ("code/b.py", b"x" * 600))
    as_tar = tar_gz(member("code/a.py", b"x" * 600), member("code/b.py", b"x" * 600))

    assert "unpacks to 1200 bytes; at most 1000 are allowed" in refusal(upload(owner, as_zip))
    assert "unpacks to 1200 bytes or more; at most 1000 are allowed" in refusal(upload(owner, as_tar))
    assert nothing_left(uploads)


def _zip_bomb(size: int) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        with archive.open("bomb/zeros.bin", "w") as out:
            chunk = bytes(MiB)
            for _ in range(size // MiB):
                out.write(chunk)
    buffer.seek(0)
    buffer.name = "bomb.zip"
    return buffer


def test_a_small_zip_that_unpacks_to_200_mib_is_refused_with_the_default_limits_and_under_a_100_mib_limit(
        owner, uploads, settings):
    archive = _zip_bomb(200 * MiB)
    assert len(archive.getvalue()) < 256 * 1024

    assert "more than 100 times its size" in refusal(upload(owner, archive))
    settings.CODE_DIR_MAX_COMPRESSION_RATIO, settings.CODE_DIR_MAX_UNPACKED_BYTES = 10**6, 100 * MiB
    archive.seek(0)
    assert "unpacks to 209715200 bytes; at most 104857600 (100 MiB) are allowed" in refusal(upload(owner, archive))
    assert nothing_left(uploads)


def test_bytes_are_counted_while_writing_so_a_header_that_lies_does_not_help(tmp_path, monkeypatch):
    # The unpacker's writing, run here: as if the declared sizes had said less than what is really there,
    # only the count while writing can tell.
    archive = tar_gz(member("code/a.py", b"x" * 600), member("code/b.py", b"x" * 600))
    limits = Limits(upload_bytes=10**6, unpacked_bytes=1000, files=10, folders=10, depth=5, ratio=1000)
    monkeypatch.setattr("jobs.code_dirs.policy._declared_size", lambda item: 0)
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(ArchiveRejected, match="more than 1000 bytes; at most 1000 are allowed"):
            unpacker._write_all(archive, root, limits, len(archive.getvalue()))
    finally:
        os.close(root)


def test_too_many_folders_or_folders_too_deep_are_refused_saying_the_limit(owner, uploads, settings):
    settings.CODE_DIR_MAX_FOLDERS, settings.CODE_DIR_MAX_DEPTH = 3, 4
    wide = tar_gz(*(member(f"code/d{index}/f.py", b"") for index in range(3)))
    deep = zip_of(("code/a/b/c/d/f.py", ""))

    assert "holds 4 folders or more; at most 3 are allowed" in refusal(upload(owner, wide, name="wide"))
    assert "5 levels deep; at most 4 are allowed" in refusal(upload(owner, deep, name="deep"))
    assert nothing_left(uploads)


@pytest.mark.parametrize("archive", [
    pytest.param(lambda: io.BytesIO(b"PK\x03\x04 not really a zip" + os.urandom(64)), id="junk"),
    pytest.param(lambda: io.BytesIO(zip_of(("code/train.py", os.urandom(3000))).getvalue()[:-40]), id="cut-zip"),
    pytest.param(lambda: io.BytesIO(tar_gz(member("code/train.py", os.urandom(30000))).getvalue()[:15000]), id="truncated-tar"),
    pytest.param(lambda: io.BytesIO(b""), id="empty-file"),
])
def test_a_damaged_or_truncated_archive_gets_a_field_error_not_a_server_error(owner, uploads, archive):
    buffer = archive()
    buffer.name = "code.tar.gz"

    message = refusal(upload(owner, buffer))

    assert "archive" in message
    assert nothing_left(uploads)


def test_a_zip_whose_data_does_not_match_its_checksum_is_refused(owner, uploads):
    data = bytearray(zip_of(("code/train.py", "print('hello world')\n" * 50)).getvalue())
    start = data.index(b"code/train.py") + len("code/train.py")
    data[start + 5] ^= 0xFF  # a byte of the deflated data

    assert "damaged" in refusal(upload(owner, io.BytesIO(bytes(data))))
    assert nothing_left(uploads)


def test_an_archive_with_no_file_is_refused(owner, uploads):
    assert "no file" in refusal(upload(owner, tar_gz(member("code", kind=tarfile.DIRTYPE))))
    assert nothing_left(uploads)


def test_an_archive_with_no_python_file_anywhere_is_refused_saying_it_has_nothing_to_boot(owner, uploads):
    no_python = (zip_of(("code/README.md", "hi"), ("code/data/train.csv", "1,2"), ("code/train.py.txt", "x")),
                 tar_gz(member("code/run.sh", b"id\n"), member("code/lib", kind=tarfile.DIRTYPE)))
    for archive in no_python:
        assert "the archive holds no Python file to boot" in refusal(upload(owner, archive))
        assert nothing_left(uploads)
    assert upload(owner, zip_of(("code/README.md", "hi"), ("code/deep/down/main.py", ""))).status_code == 201


def test_the_module_refuses_a_bad_name_before_unpacking(uploads):
    with pytest.raises(ArchiveRejected) as refused:
        create_from_archive("../up", io.BytesIO(b""))
    assert refused.value.field == "name"


def test_a_folder_given_over_and_over_is_refused_before_it_is_all_read(owner, uploads, settings):
    settings.CODE_DIR_MAX_FILES = settings.CODE_DIR_MAX_FOLDERS = 3
    archive = tar_gz(*(member("code", kind=tarfile.DIRTYPE) for _ in range(40)), member("code/train.py", b"1"))

    assert "more than 22 members" in refusal(upload(owner, archive))
    assert nothing_left(uploads)


def test_an_unpacking_that_takes_too_long_is_stopped_and_leaves_nothing(owner, uploads, settings):
    # Less than the unpacker process needs to start: it is stopped, as one stuck on an archive would be.
    settings.CODE_DIR_UNPACK_TIMEOUT_SECONDS = 0.001
    started = time.monotonic()

    assert "took longer than 0.001 seconds" in refusal(upload(owner, tar_gz(member("code/train.py", b"1"))))
    assert time.monotonic() - started < 10
    assert nothing_left(uploads)


def test_an_archive_on_disk_that_is_refused_is_refused_like_one_in_memory(uploads, tmp_path):
    # A large upload reaches the console as a file on disk, handed to the unpacker as it is.
    on_disk = tmp_path / "not-an-archive.zip"
    on_disk.write_bytes(b"this is not an archive" * 100)

    with pytest.raises(ArchiveRejected, match="neither a .zip nor a .tar.gz"):
        service.unpack(on_disk, uploads / "scratch")
    assert not (uploads / "scratch").exists()
