"""Integration tests for jobs.localcluster: real namespaces, a real bridge, real sshd.

Bridges, prefixes and subnets differ from the defaults so that a running cluster is not touched.
Traffic goes only to the addresses of the namespaces made here.
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

if os.geteuid() != 0:
    pytest.skip("needs root: network namespaces, a bridge, sshd on port 22 and useradd",
                allow_module_level=True)
for tool in ("ip", "unshare", "setsid", "ssh-keygen", "/usr/sbin/sshd"):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed", allow_module_level=True)

import asyncssh  # noqa: E402

from jobs import localcluster as lc  # noqa: E402

pytestmark = pytest.mark.integration

NET = dict(subnet="10.78.0.0/24", bridge="tctest0", prefix="tctn")
NET_DOWN = dict(subnet="10.78.1.0/24", bridge="tctest1", prefix="tctd")


def _state_dir() -> Path:
    # Under /run, not /tmp: sshd's StrictModes refuses keys reached through a world-writable dir.
    return Path(tempfile.mkdtemp(prefix="tctest-", dir="/run"))


async def _ssh_async(node: lc.LocalNode, command: str, pinned_key: str | None = None) -> str:
    known = asyncssh.import_known_hosts(f"{node.address} {pinned_key or node.host_public_key}\n")
    async with asyncssh.connect(node.address, port=node.ssh_port, username=node.ssh_user,
                                client_keys=[str(node.private_key_path)], known_hosts=known,
                                agent_path=None, connect_timeout=10) as conn:
        result = await conn.run(command, check=True, timeout=30)
        return str(result.stdout)


def ssh(node: lc.LocalNode, command: str, pinned_key: str | None = None) -> str:
    return asyncio.run(_ssh_async(node, command, pinned_key))


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def _veths(links: str, prefix: str) -> list[str]:
    return re.findall(rf"^\d+: ({prefix}\d+h)@", links, re.M)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _ns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@pytest.fixture(scope="module")
def cluster():
    state_dir = _state_dir()
    try:
        started = time.monotonic()
        nodes = lc.up(state_dir, 2, **NET)
        print(f"up of 2 nodes took {time.monotonic() - started:.2f}s")
        yield state_dir, nodes
    finally:
        lc.down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_nodes_are_described(cluster):
    state_dir, nodes = cluster
    assert [n.name for n in nodes] == ["node-0", "node-1"]
    assert [n.address for n in nodes] == ["10.78.0.10", "10.78.0.11"]
    for n in nodes:
        assert (n.ssh_port, n.ssh_user) == (22, "root")
        assert n.private_key_path == state_dir.resolve() / "id_ed25519"
        assert n.host_public_key.startswith("ssh-ed25519 ")
    assert nodes[0].host_public_key != nodes[1].host_public_key


def test_each_node_answers_ssh_as_root_with_its_own_hostname(cluster):
    _, nodes = cluster
    for n in nodes:
        assert ssh(n, "hostname; id -un").split() == [n.name, "root"]


def test_host_key_pinning_is_enforced(cluster):
    _, nodes = cluster
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        ssh(nodes[1], "true", pinned_key=nodes[0].host_public_key)


def test_nodes_have_separate_dev_shm(cluster):
    _, nodes = cluster
    ssh(nodes[0], "echo x > /dev/shm/tctest-marker")
    assert ssh(nodes[0], "ls /dev/shm").split() == ["tctest-marker"]
    assert "tctest-marker" not in ssh(nodes[1], "ls /dev/shm").split()
    assert not Path("/dev/shm/tctest-marker").exists()


def test_node0_reaches_node1(cluster):
    _, nodes = cluster
    banner = ssh(nodes[0], f"timeout 5 bash -c 'exec 3<>/dev/tcp/{nodes[1].address}/22; head -c 7 <&3'")
    assert banner == "SSH-2.0"


def test_node_can_host_a_job_container(cluster):
    _, nodes = cluster
    out = ssh(nodes[0], "command -v unshare mount tar /usr/sbin/sshd /usr/bin/python3; "
                        "getent passwd ma-user | cut -d: -f6,7")
    assert out.split()[-1] == "/home/ma-user:/bin/bash"
    assert len(out.split()) == 6
    shadow = subprocess.run(["getent", "shadow", "ma-user"], capture_output=True, text=True).stdout
    assert shadow.split(":")[1] == "*"
    # The container's own pid/uts/mount namespaces nest inside the node's.
    assert ssh(nodes[0], "unshare --uts --mount --pid --fork sh -c 'hostname j-worker-0; hostname'").strip() == "j-worker-0"
    assert ssh(nodes[0], "hostname").strip() == "node-0"


def test_up_again_is_idempotent(cluster):
    state_dir, nodes = cluster
    pids = [s.sshd_pid for s in lc.status(state_dir)]
    links = _links()
    again = lc.up(state_dir, 2, **NET)
    assert again == nodes
    assert [s.sshd_pid for s in lc.status(state_dir)] == pids
    assert _veths(_links(), "tctn") == _veths(links, "tctn") == ["tctn0h", "tctn1h"]
    addrs = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", "tctest0"], capture_output=True,
                           text=True, check=True).stdout
    assert addrs.count("10.78.0.1/24") == 1


def test_up_refuses_a_different_network_on_the_same_state(cluster):
    state_dir, _ = cluster
    with pytest.raises(ValueError, match="down it first"):
        lc.up(state_dir, 2, subnet="10.78.2.0/24", bridge="tctest0", prefix="tctn")


def test_dead_sshd_is_restarted_by_up(cluster):
    state_dir, nodes = cluster
    old = lc.status(state_dir)
    os.kill(old[1].sshd_pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not _gone(old[1].sshd_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    dead = lc.status(state_dir)[1]
    assert not dead.sshd_alive and not dead.port_open
    lc.up(state_dir, 2, **NET)
    new = lc.status(state_dir)
    assert new[0].sshd_pid == old[0].sshd_pid
    assert new[1].sshd_pid != old[1].sshd_pid
    assert all(s.namespace_exists and s.sshd_alive and s.port_open for s in new)
    assert ssh(nodes[1], "hostname").strip() == "node-1"


def test_more_nodes_are_added_and_fewer_leaves_extras_running(cluster):
    state_dir, nodes = cluster
    pids = [s.sshd_pid for s in lc.status(state_dir)]
    three = lc.up(state_dir, 3, **NET)
    assert three[:2] == nodes and three[2].address == "10.78.0.12"
    assert [s.sshd_pid for s in lc.status(state_dir)][:2] == pids
    assert ssh(three[2], "hostname").strip() == "node-2"
    assert lc.up(state_dir, 2, **NET) == nodes
    assert len(lc.status(state_dir)) == 3 and lc.status(state_dir)[2].sshd_alive


def test_unsafe_state_dir_is_refused_before_anything_is_made(tmp_path):
    with pytest.raises(ValueError, match="group/world-writable"):
        lc.up(tmp_path / "cluster", 1, **NET_DOWN)
    assert not (tmp_path / "cluster").exists()
    assert "tctest1" not in _links()


def test_down_leaves_nothing_and_is_idempotent():
    state_dir = _state_dir()
    try:
        nodes = lc.up(state_dir, 2, **NET_DOWN)
        # Something a job would leave behind, detached from the ssh session.
        ssh(nodes[0], "setsid sleep 1000 </dev/null >/dev/null 2>&1 &")
        pids = _ns_pids("tctd0") + _ns_pids("tctd1")
        assert len(pids) >= 3
        lc.down(state_dir)
        assert not {"tctd0", "tctd1"} & _namespaces()
        links = _links()
        assert "tctest1" not in links and _veths(links, "tctd") == []
        deadline = time.monotonic() + 5
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(p) for p in pids)
        assert not state_dir.exists()
        assert lc.status(state_dir) == []
        lc.down(state_dir)
        lc.down(state_dir, **{k: NET_DOWN[k] for k in ("bridge", "prefix")})
    finally:
        lc.down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_down_without_up_is_fine():
    state_dir = _state_dir()
    try:
        lc.down(state_dir)
        assert not state_dir.exists()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
