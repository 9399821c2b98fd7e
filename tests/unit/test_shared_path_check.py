"""A shared file system is mounted only where the node resolves it to itself, a folder. The SSH boundary is faked
by a connection that runs the command here, on this machine's files (the real node is in
tests/integration/test_object_storage.py)."""

import asyncio
import re
from types import SimpleNamespace

import pytest

from jobs.runtime.shared_mounts import check_shared_paths
from jobs.runtime.ssh import NodeError


class HereConnection:
    async def run(self, command, check=False, timeout=None):
        done = await asyncio.create_subprocess_exec("sh", "-c", command, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await done.communicate()
        return SimpleNamespace(exit_status=done.returncode, stdout=stdout.decode(), stderr=stderr.decode())


def check(*paths: str) -> None:
    asyncio.run(check_shared_paths(HereConnection(), "node-1", paths))


def test_a_folder_is_mounted_and_a_link_a_missing_path_or_a_file_is_not_saying_which(tmp_path):
    folder = tmp_path / "datasets"
    folder.mkdir()
    (tmp_path / "linked").symlink_to("/etc")
    (tmp_path / "file").write_text("x")
    check(str(folder))
    for path, words in ((tmp_path / "linked", "it leads to /etc on this node (a link)"),
                        (tmp_path / "missing", "it does not exist on this node"),
                        (tmp_path / "file", "it is not a folder on this node")):
        with pytest.raises(NodeError, match=re.escape(words)):
            check(str(folder), str(path))
