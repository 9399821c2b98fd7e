"""A local cluster of N "nodes" on this one machine, for running multi-node jobs for real.

Each node is a network namespace joined to a private bridge by a veth pair, with its own address,
and its own OpenSSH server that runs in a UTS + mount namespace of its own: its own hostname and its
own /dev/shm (two "nodes" sharing them break Open MPI's shared-memory transport). Root logs into every
node with one cluster key; each node's host key is reported so that the client can pin it.

Needs root. Pure system code: no Django here, and outside the app's import graph: only the
`localcluster` and `runconsole` management commands, the tests and the benchmarks use it (it lives in
jobs/ because `manage.py localcluster` is how an operator brings a local cluster up). Policy choices:
- `up` with fewer nodes than exist leaves the extra nodes running (and restarts their sshd if it
  died); it returns only the first `nodes`. `down` removes them all.
- A node whose sshd is restarted gets a fresh hostname/mount namespace, so an empty /dev/shm.
- `down` keeps the `ma-user` account unless `remove_user=True` (the host's other users may need it).
- Each node also lets `ma-user` in, with a key of its own (`user_id_ed25519`): a Slurm pool without root
  (jobs.backends.slurm) reaches its nodes as that user, whose rootless Podman keeps a store and a runtime
  folder per node (in the user's home: a node's folders of root's are not the user's to enter), as
  separate hosts would.
- state_dir must be reachable through root-owned directories that are not group/world-writable
  (sshd's StrictModes checks the authorized-keys path): /run/... or /root/... work, /tmp/... does not.
"""
from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
# What Podman needs on these machines (runc, ulimits, cgroupfs): the same file real nodes install.
CONTAINERS_CONF = Path(__file__).resolve().parent / "images" / "containers.conf"
SSH_PORT = 22
JOB_USER = "ma-user"
WAIT_S = 15.0
STATE = "state.json"
# Everything `up` writes into state_dir; `down` removes exactly these.
OWNED = (STATE, STATE + ".tmp", "nodes", "id_ed25519", "id_ed25519.pub", "authorized_keys", "known_hosts", ".lock",
         "user_id_ed25519", "user_id_ed25519.pub")
# Runs inside the node's fresh UTS + mount namespace; names arrive as $1.. so nothing is interpolated.
NODE_INIT = ('hostname "$1" && mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm'
             ' && echo $$ > "$3" && exec ' + SSHD + ' -D -e -f "$2"')


@dataclass
class LocalNode:
    name: str
    address: str
    ssh_port: int
    ssh_user: str
    private_key_path: Path
    host_public_key: str


@dataclass
class NodeStatus:
    name: str
    address: str
    namespace: str
    namespace_exists: bool
    sshd_pid: int | None
    sshd_alive: bool
    port_open: bool


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def _netns_list() -> set[str]:
    return {line.split()[0] for line in _run("ip", "netns", "list").stdout.splitlines() if line.strip()}


def _link_exists(name: str, ns: str | None = None) -> bool:
    return _run("ip", *(["-n", ns] if ns else []), "link", "show", "dev", name, check=False).returncode == 0


def _netns_pids(ns: str) -> list[int]:
    out = _run("ip", "netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _alive(pid: int | None, conf: Path) -> bool:
    # A dead sshd may linger as a zombie if nobody reaps it, and a PID can be reused: check both.
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X") and str(conf).encode() in cmdline


def _port_open(address: str, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, SSH_PORT), timeout=timeout):
            return True
    except OSError:
        return False


def _check_safe(path: Path) -> None:
    for d in [path, *path.parents]:
        st = d.stat()
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise ValueError(f"state_dir {path}: {d} must be root-owned and not group/world-writable "
                             "(sshd StrictModes would refuse the authorized keys); use e.g. /run/<name>")


@contextmanager
def _locked(state_dir: Path):
    fd = os.open(state_dir / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _load(state_dir: Path) -> dict | None:
    try:
        return json.loads((state_dir / STATE).read_text())
    except FileNotFoundError:
        return None


def _save(state_dir: Path, state: dict) -> None:
    tmp = state_dir / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_dir / STATE)


def _keygen(path: Path, comment: str) -> str:
    if not path.exists():
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))
    return " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])


def _ensure_user() -> None:
    if _run("getent", "passwd", JOB_USER, check=False).returncode != 0:
        uid = ["-u", "1000"] if _run("getent", "passwd", "1000", check=False).returncode != 0 else []
        _run("useradd", "-m", "-d", f"/home/{JOB_USER}", "-s", "/bin/bash", *uid, JOB_USER)
    # useradd leaves "!" (locked), and sshd then refuses even key logins; "*" allows keys only.
    if _run("getent", "shadow", JOB_USER).stdout.split(":")[1].startswith("!"):
        _run("usermod", "-p", "*", JOB_USER)


def _ensure_subordinate_ids() -> None:
    """Rootless Podman maps a container's users onto the user's subordinate ids (newuidmap, Debian's uidmap)."""
    for table, option in (("/etc/subuid", "--add-subuids"), ("/etc/subgid", "--add-subgids")):
        lines = Path(table).read_text().splitlines() if Path(table).exists() else []
        if any(line.split(":")[0] == JOB_USER for line in lines):
            continue
        ends = [int(fields[1]) + int(fields[2]) for line in lines if len(fields := line.split(":")) == 3
                and fields[1].isdigit() and fields[2].isdigit()]
        first = max([100000, *ends])
        _run("usermod", option, f"{first}-{first + 65535}", JOB_USER)


def user_folder(state_dir: Path, node_name: str) -> Path:
    """The job user's own folder for one node of this cluster (its rootless Podman's store and runtime)."""
    tag = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:12]
    return Path(pwd.getpwnam(JOB_USER).pw_dir) / ".localcluster" / tag / node_name


def _user_owned(folder: Path) -> None:
    """Make folder (below the user's home) and each folder between, the user's own and nobody else's."""
    entry = pwd.getpwnam(JOB_USER)
    relative = folder.relative_to(entry.pw_dir)
    for part in [*reversed(relative.parents), relative]:
        if str(part) == ".":
            continue
        path = Path(entry.pw_dir) / part
        path.mkdir(mode=0o700, exist_ok=True)
        # Root works in the user's home here: it follows no link the user could have put in its way.
        if path.is_symlink():
            raise RuntimeError(f"{path} is a link: refusing to work through it as root")
        os.lchown(path, entry.pw_uid, entry.pw_gid)


def _ensure_node_user_folder(folder: Path) -> None:
    _user_owned(folder / "run")
    conf = folder / "storage.conf"
    if conf.is_symlink():
        raise RuntimeError(f"{conf} is a link: refusing to write through it as root")
    # Rootless Podman reads rootless_storage_path, not graphroot; its runroot follows XDG_RUNTIME_DIR.
    conf.write_text(_storage_conf(folder) + f'rootless_storage_path = "{folder / "containers" / "storage"}"\n')
    entry = pwd.getpwnam(JOB_USER)
    os.lchown(conf, entry.pw_uid, entry.pw_gid)


def _storage_conf(ndir: Path) -> str:
    # Each node keeps its own images, as separate hosts would: a job's image really has to reach it.
    return (f'[storage]\ndriver = "overlay"\ngraphroot = "{ndir / "containers" / "storage"}"\n'
            f'runroot = "{ndir / "containers" / "run"}"\n')


def _sshd_config(address: str, host_key: Path, authorized: Path, pidfile: Path, storage_conf: Path,
                 user_folder: Path) -> str:
    return "\n".join([
        f"Port {SSH_PORT}", f"ListenAddress {address}", f"HostKey {host_key}",
        f"PidFile {pidfile}", "AllowUsers root " + JOB_USER,
        "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "UseDNS no",
        # The console opens many sessions and connections to one node at once.
        "MaxStartups 100", "MaxSessions 100",
        "X11Forwarding no", "PrintMotd no", "Subsystem sftp internal-sftp",
        # Debian's bash sources ~/.bashrc for every ssh command unless SHLVL says it is nested; the
        # host root's .bashrc (pyenv init: ~130 ms) would then tax each of the console's many commands.
        # Podman, run by the console over this SSH, uses the node's own image store and settings.
        "Match User root", f"AuthorizedKeysFile {authorized}",
        f"SetEnv SHLVL=1 CONTAINERS_CONF={CONTAINERS_CONF} CONTAINERS_STORAGE_CONF={storage_conf}",
        # The user's key is read as the user (sshd drops to it), so it lies in the user's folder; its rootless
        # Podman keeps this node's store and pause process apart from the other nodes' (one host here).
        f"Match User {JOB_USER}", f"AuthorizedKeysFile {user_folder.parent / 'authorized_keys'}",
        f"SetEnv SHLVL=1 CONTAINERS_CONF={CONTAINERS_CONF} CONTAINERS_STORAGE_CONF={user_folder / 'storage.conf'} "
        f"XDG_RUNTIME_DIR={user_folder / 'run'}", ""])


def _ensure_net(node: dict, bridge: str, plen: int, gateway: str) -> bool:
    """Returns True when the namespace had to be made anew (its old sshd, if any, is stranded)."""
    ns, veth = node["namespace"], node["veth"]
    fresh = ns not in _netns_list()
    if fresh:
        _run("ip", "netns", "add", ns)
        if _link_exists(veth):  # still paired with the lost namespace
            _run("ip", "link", "del", veth)
    if not _link_exists(veth):
        _run("ip", "-n", ns, "link", "del", "eth0", check=False)  # half of a broken pair
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _run("ip", "link", "set", veth, "master", bridge, "up")
    _run("ip", "-n", ns, "addr", "replace", f"{node['address']}/{plen}", "dev", "eth0")
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    _run("ip", "-n", ns, "link", "set", "eth0", "up")
    _run("ip", "-n", ns, "route", "replace", "default", "via", gateway)
    return fresh


def _launch(node: dict, ndir: Path, conf: Path) -> int:
    pidfile, log = ndir / "sshd.pid", ndir / "sshd.log"
    pidfile.unlink(missing_ok=True)
    with open(log, "ab") as out:  # setsid -f: sshd is not our child and outlives us
        # nsenter, not `ip netns exec`: that one mounts a sysfs of its own, which hides the cgroup
        # hierarchies Podman needs to limit a container's memory and CPUs.
        subprocess.run(["setsid", "-f", "nsenter", f"--net=/run/netns/{node['namespace']}",
                        "unshare", "--uts", "--mount", "--propagation", "private",
                        "sh", "-c", NODE_INIT, "sh", node["name"], str(conf), str(pidfile)],
                       stdin=subprocess.DEVNULL, stdout=out, stderr=out, check=True)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        if text.isdigit():
            return int(text)
        time.sleep(0.05)
    raise RuntimeError(f"{node['name']}: sshd did not start; see {log}:\n{_tail(log)}")


def _tail(log: Path, n: int = 10) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:]) if log.exists() else ""


def gateway(subnet: str) -> str:
    """The cluster's bridge address on this machine: where the nodes reach the console's own services."""
    return str(ipaddress.ip_network(subnet).network_address + 1)


def up(state_dir: Path, nodes: int, *, subnet: str = "10.77.0.0/24", bridge: str = "tcbr0",  # noqa: C901 - each step of bringing the cluster up, in order, each idempotent
       prefix: str = "tcnode") -> list[LocalNode]:
    if nodes < 1:
        raise ValueError("nodes must be >= 1")
    net = ipaddress.ip_network(subnet)
    gateway = net.network_address + 1
    # A prefix ending in a digit would make "<prefix><i>" ambiguous, and down's sweep with it.
    if not re.fullmatch(r"[A-Za-z]([A-Za-z0-9_-]*[A-Za-z_-])?", prefix) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,14}", bridge):
        raise ValueError("bridge/prefix: letters, digits, '_', '-'; prefix not ending in a digit; "
                         "bridge at most 15 characters")
    state_dir = Path(state_dir).resolve()  # sshd checks the real path
    _check_safe(next(d for d in [state_dir, *state_dir.parents] if d.exists()))  # before creating anything
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    _check_safe(state_dir)
    with _locked(state_dir):
        config = {"subnet": str(net), "bridge": bridge, "prefix": prefix}
        state = _load(state_dir) or {**config, "nodes": []}
        if {k: state[k] for k in config} != config:
            raise ValueError(f"{state_dir} holds a cluster with {({k: state[k] for k in config})}; down it first")
        for i in range(len(state["nodes"]), nodes):
            address = net.network_address + 10 + i
            # As integers: mypy cannot tell that the address and the network are the same IP version.
            if int(address) >= int(net.broadcast_address) or len(f"{prefix}{i}h") > 15:
                raise ValueError(f"node {i} does not fit subnet {net} / 15-character interface names")
            state["nodes"].append({"name": f"node-{i}", "namespace": f"{prefix}{i}", "veth": f"{prefix}{i}h",
                                   "address": str(address), "pid": None, "host_public_key": ""})
        _save(state_dir, state)  # before touching the system, so that down can find partial work
        _ensure_user()
        _ensure_subordinate_ids()
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        client_pub = _keygen(state_dir / "id_ed25519", "localcluster")
        authorized = state_dir / "authorized_keys"
        authorized.write_text(client_pub + "\n")
        os.chmod(authorized, 0o600)
        user_pub = _keygen(state_dir / "user_id_ed25519", "localcluster-user")
        users_folder = user_folder(state_dir, "-").parent
        _user_owned(users_folder)
        if (users_folder / "authorized_keys").is_symlink():
            raise RuntimeError(f"{users_folder / 'authorized_keys'} is a link: refusing to write through it as root")
        (users_folder / "authorized_keys").write_text(user_pub + "\n")
        os.chmod(users_folder / "authorized_keys", 0o600)
        os.lchown(users_folder / "authorized_keys", pwd.getpwnam(JOB_USER).pw_uid, pwd.getpwnam(JOB_USER).pw_gid)
        if not _link_exists(bridge):
            _run("ip", "link", "add", "name", bridge, "type", "bridge")
        _run("ip", "addr", "replace", f"{gateway}/{net.prefixlen}", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        for node in state["nodes"]:
            ndir = state_dir / "nodes" / node["name"]
            ndir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fresh = _ensure_net(node, bridge, net.prefixlen, str(gateway))
            node["host_public_key"] = _keygen(ndir / "ssh_host_ed25519_key", node["name"])
            conf = ndir / "sshd_config"
            if fresh and _alive(node["pid"], conf):
                os.kill(node["pid"], signal.SIGKILL)
                node["pid"] = None
            storage_conf = ndir / "storage.conf"
            storage_conf.write_text(_storage_conf(ndir))
            _ensure_node_user_folder(user_folder(state_dir, node["name"]))
            text = _sshd_config(node["address"], ndir / "ssh_host_ed25519_key", authorized, ndir / "sshd.pid",
                                storage_conf, user_folder(state_dir, node["name"]))
            changed = not conf.exists() or conf.read_text() != text
            if changed:
                conf.write_text(text)
            if not _alive(node["pid"], conf):
                node["pid"] = _launch(node, ndir, conf)
            elif changed:
                os.kill(node["pid"], signal.SIGHUP)  # sshd re-execs itself with the new config
            _save(state_dir, state)
        (state_dir / "known_hosts").write_text(
            "".join(f"{n['address']} {n['host_public_key']}\n" for n in state["nodes"]))
        deadline = time.monotonic() + WAIT_S
        for node in state["nodes"]:
            log = state_dir / "nodes" / node["name"] / "sshd.log"
            while not _port_open(node["address"]):
                conf = state_dir / "nodes" / node["name"] / "sshd_config"
                if not _alive(node["pid"], conf) or time.monotonic() > deadline:
                    raise RuntimeError(f"{node['name']}: sshd on {node['address']}:{SSH_PORT} is not "
                                       f"accepting connections; see {log}:\n{_tail(log)}")
                time.sleep(0.05)
    return [LocalNode(n["name"], n["address"], SSH_PORT, "root", state_dir / "id_ed25519",
                      n["host_public_key"]) for n in state["nodes"][:nodes]]


def _kill_all(ns: str) -> None:
    # Jobs leave processes in the namespace (containers, ranks); TERM first, then KILL.
    deadline = time.monotonic() + 10
    start = time.monotonic()
    while pids := _netns_pids(ns):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{ns}: processes survive SIGKILL: {pids}")
        sig = signal.SIGTERM if time.monotonic() - start < 1 else signal.SIGKILL
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def down(state_dir: Path, *, bridge: str | None = None, prefix: str | None = None,  # noqa: C901 - each step of taking the cluster down, in order, each idempotent
         remove_user: bool = False) -> None:
    """Tear down the cluster in state_dir. bridge/prefix (default: from the state) also sweep
    namespaces `<prefix><n>` and their veths left by a run whose state was lost."""
    state_dir = Path(state_dir).resolve()
    state = _load(state_dir) if state_dir.is_dir() else None
    nodes = state["nodes"] if state else []
    bridge = bridge or (state["bridge"] if state else None)
    prefix = prefix or (state["prefix"] if state else None)
    swept = {ns for ns in _netns_list() if prefix and re.fullmatch(re.escape(prefix) + r"\d+", ns)}
    namespaces = swept | {n["namespace"] for n in nodes}
    for ns in sorted(namespaces):
        _kill_all(ns)
    for n in nodes:  # an sshd outside its namespace should not exist, but must not survive either
        if _alive(n["pid"], state_dir / "nodes" / n["name"] / "sshd_config"):
            os.kill(n["pid"], signal.SIGKILL)
    for ns in sorted(namespaces):
        if ns in _netns_list():
            _run("ip", "netns", "del", ns)
        # Deleting the namespace takes its veth peer down with it, asynchronously: the host end may
        # vanish between the check and the delete, which is the outcome wanted anyway.
        if _link_exists(ns + "h"):
            deleted = _run("ip", "link", "del", ns + "h", check=False)
            if deleted.returncode != 0 and _link_exists(ns + "h"):
                raise RuntimeError(f"ip link del {ns}h failed: {deleted.stderr.strip()}")
    if bridge and _link_exists(bridge):
        _run("ip", "link", "del", bridge)
    if state_dir.is_dir():
        for name in OWNED:
            p = state_dir / name
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        if not any(state_dir.iterdir()):
            state_dir.rmdir()
    if _user_exists():
        # The user's rootless stores of this cluster's nodes (their files belong to its subordinate ids: root's rm).
        shutil.rmtree(user_folder(state_dir, "-").parent, ignore_errors=True)
    if remove_user:
        _run("userdel", "-r", JOB_USER, check=False)


def _user_exists() -> bool:
    try:
        pwd.getpwnam(JOB_USER)
    except KeyError:
        return False
    return True


def user_login(state_dir: Path, node: LocalNode) -> LocalNode:
    """How to reach a node as the job user instead of root (its own key), for a pool that runs without root."""
    return LocalNode(node.name, node.address, node.ssh_port, JOB_USER, Path(state_dir).resolve() / "user_id_ed25519",
                     node.host_public_key)


def status(state_dir: Path) -> list[NodeStatus]:
    state_dir = Path(state_dir).resolve()
    state = _load(state_dir) if state_dir.is_dir() else None
    if not state:
        return []
    existing = _netns_list()
    out = []
    for n in state["nodes"]:
        exists = n["namespace"] in existing
        alive = _alive(n["pid"], state_dir / "nodes" / n["name"] / "sshd_config")
        out.append(NodeStatus(n["name"], n["address"], n["namespace"], exists, n["pid"], alive,
                              exists and _port_open(n["address"])))
    return out
