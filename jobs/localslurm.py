"""A real Slurm on this machine, over the local cluster's nodes: munge, slurmdbd (on the machine's MariaDB),
slurmctld, slurmrestd and one slurmd per node, each in that node's network namespace.

What a site runs, brought up from Debian's packages so that a Slurm pool can be tried and tested here. Pure
system code like jobs.localcluster: no Django; the `localslurm` management command and the tests use it.
Needs root. Choices, each measured on these machines:
- Every daemon of one instance has its own ports, munge socket and key, database and state folder, so the
  console's instance and the tests' ones live side by side; `down` removes exactly what `up` made.
- slurmd runs under `nsenter --net` in its node's namespace, not `ip netns exec` (which mounts a sysfs of its
  own: slurmd's cgroup plugin then finds no hierarchy). `SlurmdParameters=config_overrides` lets a node say it
  has the CPUs and memory its spec declares, more than the shared host has.
- slurmrestd refuses to run as root or as SlurmUser: it runs as a system user of its own (`slurmrest`) and
  takes JWTs signed with the instance's HS256 key (`AuthAltTypes=auth/jwt`).
- The scheduler looks at the queue every 2 s and backfills every 2 s (Slurm's defaults, 60 and 30 s, are
  for clusters of thousands of jobs; here they would make every submission wait).
"""
from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

REST_USER = "slurmrest"
SLURM_USER = "slurm"
MUNGE_USER = "munge"
WAIT_S = 60.0
STATE = "state.json"
REST_PLUGINS = "openapi/v0.0.38,openapi/dbv0.0.38"


@dataclass(frozen=True)
class SlurmNode:
    """A node of the local cluster as Slurm sees it: its name, the address slurmctld reaches it at, and the
    network namespace its slurmd runs in."""

    name: str
    address: str
    namespace: str
    cpus: int = 4
    memory_mb: int = 4096


@dataclass(frozen=True)
class Ports:
    controller: int
    node: int
    accounting: int
    rest: int

    @classmethod
    def from_base(cls, base: int) -> Ports:
        # Slurm's own defaults are 6817 (slurmctld), 6818 (slurmd), 6819 (slurmdbd); slurmrestd has none.
        return cls(base, base + 1, base + 2, base + 3)


# An instance counts its job ids from its own base; it runs far fewer jobs than this before it is taken down.
JOB_ID_SPAN = 100
CGROUP_ROOT = Path("/sys/fs/cgroup")


def first_job_id(ports: Ports) -> int:
    return ports.controller * 100


def remove_job_cgroups(first: int, root: Path = CGROUP_ROOT) -> list[str]:
    """Remove the empty cgroup folders the instance's jobs left on its nodes, deepest first; what could not be removed
    (a process still in it) is returned. A job Slurm ended from its side (a scancel, a time limit) while the containers
    of a pool without root were below its step keeps its step's and its own, root's, which Slurm does not come back
    to (docs/slurm.md); taken down, the instance leaves none."""
    left = []
    for job in root.glob("*/slurm_*/uid_*/job_*"):
        number = job.name.removeprefix("job_")
        if not number.isdigit() or not first <= int(number) < first + JOB_ID_SPAN:
            continue
        for folder in sorted((path for path in job.rglob("*") if path.is_dir()), key=lambda path: -len(path.parts)):
            try:
                folder.rmdir()
            except OSError:
                left.append(str(folder))
        try:
            job.rmdir()
        except OSError:
            left.append(str(job))
    return left


@dataclass(frozen=True)
class LocalSlurm:
    """What a client needs: the REST address, the cluster's and its partition's names, the config file for
    the command-line tools."""

    cluster: str
    partition: str
    rest_url: str
    conf: Path
    state_dir: Path


@dataclass
class DaemonStatus:
    name: str
    pid: int | None
    alive: bool


def _run(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip() or result.stdout.strip()}")
    return result


def _ensure_system_user(name: str) -> None:
    if _run("getent", "passwd", name, check=False).returncode != 0:
        _run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name)


def _uid_gid(user: str) -> tuple[int, int]:
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def _owned(path: Path, user: str, mode: int) -> Path:
    uid, gid = _uid_gid(user)
    os.chown(path, uid, gid)
    os.chmod(path, mode)
    return path


def _let_daemons_through(state_dir: Path) -> None:
    """munged, slurmctld and slurmd run as their own users and must reach their files: a folder above the state's
    that others may not pass through (a folder made 0700 with what it holds, as podman makes a missing --root) is
    given g+x and o+x, passage only, no listing (munged wants passage for all on the way to its socket)."""
    passage = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
    for folder in state_dir.parents:
        mode = stat.S_IMODE(folder.stat().st_mode)
        if mode & passage != passage:
            os.chmod(folder, mode | passage)


def _folder(path: Path, user: str = "root", mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return _owned(path, user, mode)


def _alive(pid: int | None, marker: str) -> bool:
    """The process lives, is no zombie, and is ours: its command line or environment names this instance."""
    if not pid:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        seen = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return state not in ("Z", "X") and marker.encode() in seen


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _has_pid(path: Path) -> bool:
    return _read_pid(path) is not None


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _wait(what: str, ready: Callable[[], bool], log: Path, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up in {timeout:.0f} s; the end of {log}:\n{_tail(log)}")
        time.sleep(0.2)


def slurm_conf(state_dir: Path, cluster: str, controller_address: str, ports: Ports,
               nodes: Sequence[SlurmNode], partition: str) -> str:
    """The instance's slurm.conf: one partition of every node, accounting to this instance's slurmdbd."""
    munge_socket = state_dir / "munge" / "munge.socket"
    lines = [
        f"ClusterName={cluster}",
        f"SlurmctldHost={socket.gethostname().split('.')[0]}({controller_address})",
        f"SlurmctldPort={ports.controller}",
        f"SlurmdPort={ports.node}",
        # Job ids of its own (its ports are its own): nodes of several instances on one host share Slurm's cgroup
        # folders (slurm_<node>/uid_<u>/job_<id>), which one instance's job 1 must not find made by another's.
        f"FirstJobId={first_job_id(ports)}",
        f"SlurmUser={SLURM_USER}",
        "AuthType=auth/munge",
        # cred_expire is also how long a requeued job waits before it may start again: 120 s by default.
        f"AuthInfo=socket={munge_socket},cred_expire=15",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={state_dir / 'jwt.key'}",
        f"StateSaveLocation={state_dir / 'controller'}",
        f"SlurmdSpoolDir={state_dir / 'nodes' / '%n'}",
        f"SlurmctldPidFile={state_dir / 'slurmctld.pid'}",
        f"SlurmdPidFile={state_dir / 'nodes' / '%n' / 'slurmd.pid'}",
        f"SlurmctldLogFile={state_dir / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={state_dir / 'log' / 'slurmd-%n.log'}",
        # Every process of a job, its containers' included, lives in the job's cgroups: limited and accounted.
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup",
        "JobAcctGatherType=jobacct_gather/cgroup",
        "JobAcctGatherFrequency=task=5",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerParameters=sched_interval=2,bf_interval=2",
        # A stopped job's processes get SIGTERM, then SIGKILL this many seconds later: Slurm's default, which a step's
        # hold of its container on SIGTERM (jobs.runtime.slurm_step.HOLD_AT_MOST_SECONDS) fits in.
        "KillWait=30",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={ports.accounting}",
        # For slurmdbd, Slurm reads this as the munge socket to sign with.
        f"AccountingStoragePass={munge_socket}",
        "AccountingStorageEnforce=associations,limits,qos",
        "AccountingStorageTRES=cpu,mem,node,gres/gpu",
        "PriorityType=priority/multifactor",
        "PriorityWeightFairshare=10000",
        "PriorityWeightQOS=10000",
        "PreemptType=preempt/qos",
        "PreemptMode=REQUEUE",
        "JobRequeue=1",
    ]
    lines += [f"NodeName={node.name} NodeAddr={node.address} CPUs={node.cpus} RealMemory={node.memory_mb} State=UNKNOWN"
              for node in nodes]
    lines.append(f"PartitionName={partition} Nodes={','.join(node.name for node in nodes)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def cgroup_conf() -> str:
    # These kernels mount cgroup v1 controllers (and an empty v2 tree): Slurm's v1 plugin holds the limits.
    return "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainCores=yes\nConstrainRAMSpace=yes\n"


def slurmdbd_conf(state_dir: Path, ports: Ports, database: str) -> str:
    return "\n".join([
        "AuthType=auth/munge",
        f"AuthInfo=socket={state_dir / 'munge' / 'munge.socket'}",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={state_dir / 'jwt.key'}",
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={ports.accounting}",
        f"SlurmUser={SLURM_USER}",
        f"LogFile={state_dir / 'log' / 'slurmdbd.log'}",
        f"PidFile={state_dir / 'slurmdbd.pid'}",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        "StoragePort=3306",
        "StorageUser=root",
        f"StorageLoc={database}",
        "",
    ])


@contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    descriptor = os.open(state_dir / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _load(state_dir: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((state_dir / STATE).read_text())
        return state
    except FileNotFoundError:
        return None


def _save(state_dir: Path, state: dict[str, Any]) -> None:
    (state_dir / (STATE + ".tmp")).write_text(json.dumps(state, indent=2))
    (state_dir / (STATE + ".tmp")).replace(state_dir / STATE)


def tool_env(conf: Path) -> dict[str, str]:
    """The environment the command-line tools (sinfo, sacctmgr, scontrol) need to find this instance."""
    return {**os.environ, "SLURM_CONF": str(conf)}


def _write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def _stop(pid: int | None, marker: str, grace: float = 10.0) -> None:
    if not _alive(pid, marker):
        return
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid, marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid, marker):
        os.kill(pid, signal.SIGKILL)


def _write_secret(path: Path, data: bytes) -> None:
    # Made unreadable to others from its first byte, not chmod-ed after.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


def _start_munge(state_dir: Path) -> None:
    # munged wants its socket folder open to all (every daemon and tool signs through it), its key closed.
    folder = _folder(state_dir / "munge", MUNGE_USER, 0o755)
    key = state_dir / "munge.key"
    if not key.exists():
        _write_secret(key, secrets.token_bytes(128))
    _owned(key, MUNGE_USER, 0o400)
    pid_file = folder / "munged.pid"
    if _alive(_read_pid(pid_file), str(folder)):
        return
    (folder / "munge.socket").unlink(missing_ok=True)
    _run("setpriv", f"--reuid={MUNGE_USER}", f"--regid={MUNGE_USER}", "--init-groups", "munged",
         f"--key-file={key}", f"--socket={folder / 'munge.socket'}", f"--pid-file={pid_file}",
         f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'seed'}")
    _wait("munged", lambda: (folder / "munge.socket").exists(), folder / "munged.log")


def up(state_dir: Path, nodes: Sequence[SlurmNode], *, controller_address: str, cluster: str = "console",  # noqa: C901 - each daemon in the order Slurm needs them, each step idempotent
       partition: str = "batch", base_port: int = 6817, database: str | None = None,
       users: Sequence[str] = ()) -> LocalSlurm:
    """Bring the instance up (or leave what already runs): returns how to reach it.

    `users` are the accounts' users made ready to submit: each gets an association with the account
    `console` (Slurm refuses a job of a user it has no association for, as AccountingStorageEnforce says).
    """
    if not nodes:
        raise ValueError("a local Slurm needs at least one node")
    database = database or f"slurm_{cluster}"
    if not re.fullmatch(r"[a-z][a-z0-9]{0,30}", cluster) or not re.fullmatch(r"[a-z][a-z0-9]{0,30}", partition) \
            or not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", database):
        raise ValueError("cluster, partition and database names: lower-case letters and digits (and _ in the database's)")
    ports = Ports.from_base(base_port)
    state_dir = Path(state_dir).resolve()
    for user in (REST_USER,):
        _ensure_system_user(user)
    for user in (SLURM_USER, MUNGE_USER):
        if _run("getent", "passwd", user, check=False).returncode != 0:
            raise RuntimeError(f"user {user} is missing: install Debian's slurm-wlm and munge packages")
    if not _port_open("127.0.0.1", 3306):
        raise RuntimeError("slurmdbd keeps its accounting in MariaDB (or MySQL) at 127.0.0.1:3306, and nothing "
                           "answers there: start the database server first")
    _folder(state_dir, "root", 0o755)
    _let_daemons_through(state_dir)
    with _locked(state_dir):
        state = _load(state_dir) or {"cluster": cluster, "base_port": base_port, "database": database, "pids": {}}
        if (state["cluster"], state["base_port"], state["database"]) != (cluster, base_port, database):
            raise ValueError(f"{state_dir} holds the cluster {state['cluster']} on ports from {state['base_port']}; "
                             "take it down first")
        _save(state_dir, state)  # before starting anything, so that down can find partial work
        for name in ("controller", "log", "nodes"):
            _folder(state_dir / name, SLURM_USER, 0o755)
        jwt_key = state_dir / "jwt.key"
        if not jwt_key.exists():
            _write_secret(jwt_key, secrets.token_bytes(32))
        _owned(jwt_key, SLURM_USER, 0o600)
        conf = state_dir / "slurm.conf"
        changed = _write_if_changed(conf, slurm_conf(state_dir, cluster, controller_address, ports, nodes, partition))
        _write_if_changed(state_dir / "cgroup.conf", cgroup_conf())
        os.chmod(conf, 0o644)
        dbd_conf = state_dir / "slurmdbd.conf"
        _write_if_changed(dbd_conf, slurmdbd_conf(state_dir, ports, database))
        _owned(dbd_conf, SLURM_USER, 0o600)  # slurmdbd refuses a config others can read
        env = tool_env(conf)
        marker = f"SLURM_CONF={conf}"
        pids = state["pids"]

        _start_munge(state_dir)

        if not _alive(pids.get("slurmdbd"), marker):
            _run("slurmdbd", env=env)
            pids["slurmdbd"] = None
        _wait("slurmdbd", lambda: _port_open("127.0.0.1", ports.accounting), state_dir / "log" / "slurmdbd.log")
        pids["slurmdbd"] = _read_pid(state_dir / "slurmdbd.pid")
        _save(state_dir, state)

        if changed and _alive(pids.get("slurmctld"), marker):
            _stop(pids["slurmctld"], marker)  # a new node list needs a restart, not a reconfigure
        if not _alive(pids.get("slurmctld"), marker):
            _run("slurmctld", env=env)
        _wait("slurmctld", lambda: _run("scontrol", "ping", env=env, check=False).stdout.count("UP") > 0,
              state_dir / "log" / "slurmctld.log")
        pids["slurmctld"] = _read_pid(state_dir / "slurmctld.pid")
        _save(state_dir, state)

        # A node no longer in the list (renamed, or the cluster made smaller) must not keep its slurmd: it
        # would hold the node's port against the new one.
        wanted = {f"slurmd:{node.name}" for node in nodes}
        for key in [key for key in pids if key.startswith("slurmd:") and key not in wanted]:
            _stop(pids.pop(key), marker)
        _save(state_dir, state)
        for node in nodes:
            spool = _folder(state_dir / "nodes" / node.name, "root", 0o755)
            key = f"slurmd:{node.name}"
            if changed and _alive(pids.get(key), marker):
                _stop(pids[key], marker)
            if not _alive(pids.get(key), marker):
                _run("nsenter", f"--net=/run/netns/{node.namespace}", "slurmd", "-N", node.name, env=env)
            pid_file = spool / "slurmd.pid"
            _wait(f"slurmd of {node.name}", partial(_has_pid, pid_file), state_dir / "log" / f"slurmd-{node.name}.log")
            pids[key] = _read_pid(spool / "slurmd.pid")
            _save(state_dir, state)
        names = ",".join(node.name for node in nodes)
        _wait("the nodes", lambda: _nodes_usable(env, names), state_dir / "log" / "slurmctld.log")

        rest_log = state_dir / "log" / "slurmrestd.log"
        if changed and _alive(pids.get("slurmrestd"), marker):
            _stop(pids["slurmrestd"], marker)
        if not _alive(pids.get("slurmrestd"), marker):
            with open(rest_log, "ab") as out:
                # setsid -f: it is not our child and outlives this process; setpriv execs, so its pid is slurmrestd's.
                subprocess.run(["setsid", "-f", "sh", "-c", 'echo $$ > "$1"; shift; exec "$@"', "sh",
                                str(state_dir / "slurmrestd.pid"), "setpriv", f"--reuid={REST_USER}",
                                f"--regid={REST_USER}", "--init-groups", "env", "SLURM_JWT=daemon", marker,
                                "slurmrestd", "-a", "rest_auth/jwt", "-s", REST_PLUGINS, f"127.0.0.1:{ports.rest}"],
                               stdin=subprocess.DEVNULL, stdout=out, stderr=out, check=True, cwd="/")
        _wait("slurmrestd", lambda: _port_open("127.0.0.1", ports.rest), rest_log)
        pids["slurmrestd"] = _read_pid(state_dir / "slurmrestd.pid")
        _save(state_dir, state)

        sacctmgr(state_dir, "add", "account", "console", "Description=the console's jobs", "Organization=console")
        for user in users:
            sacctmgr(state_dir, "add", "user", user, "Account=console")
    return LocalSlurm(cluster, partition, f"http://127.0.0.1:{ports.rest}", conf, state_dir)


def _nodes_usable(env: dict[str, str], names: str) -> bool:
    states = _run("sinfo", "-h", "-N", "-n", names, "-o", "%T", env=env, check=False).stdout.split()
    return bool(states) and all(state.rstrip("*~#") in ("idle", "mixed", "allocated", "completing") for state in states)


def sacctmgr(state_dir: Path, *args: str) -> str:
    """Run `sacctmgr -i` against the instance; adding what exists already is not an error (`up` is repeated)."""
    result = _run("sacctmgr", "-i", *args, env=tool_env(Path(state_dir) / "slurm.conf"), check=False)
    if result.returncode != 0 and "Nothing new added" not in result.stdout + result.stderr \
            and "already exists" not in result.stdout + result.stderr:
        raise RuntimeError(f"sacctmgr {' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def token(state_dir: Path, user: str, lifespan_s: int = 3600) -> str:
    """A JWT for `user` (what a site's admin gives the console for the Slurm user it submits as)."""
    out = _run("scontrol", "token", f"username={user}", f"lifespan={lifespan_s}",
               env=tool_env(Path(state_dir) / "slurm.conf")).stdout
    return out.strip().split("=", 1)[1]


def jwt_key(state_dir: Path) -> bytes:
    """The instance's HS256 key, for a console that signs its own tokens (as slurmrestd's `jwt_key` checks them)."""
    return (Path(state_dir) / "jwt.key").read_bytes()


def status(state_dir: Path) -> list[DaemonStatus]:
    state_dir = Path(state_dir).resolve()
    state = _load(state_dir) if state_dir.is_dir() else None
    if not state:
        return []
    marker = f"SLURM_CONF={state_dir / 'slurm.conf'}"
    munge_pid = _read_pid(state_dir / "munge" / "munged.pid")
    found = [DaemonStatus("munged", munge_pid, _alive(munge_pid, str(state_dir / "munge")))]
    found += [DaemonStatus(name, pid, _alive(pid, marker)) for name, pid in state["pids"].items()]
    return found


def down(state_dir: Path, *, drop_database: bool = True) -> None:
    """Stop every daemon of the instance, drop its accounting database, remove its folder."""
    state_dir = Path(state_dir).resolve()
    state = _load(state_dir) if state_dir.is_dir() else None
    if state:
        marker = f"SLURM_CONF={state_dir / 'slurm.conf'}"
        pids = state["pids"]
        # The REST front and the nodes first, then the controller, then accounting (the controller
        # sends it what it still holds as it ends).
        order = ["slurmrestd", *sorted(key for key in pids if key.startswith("slurmd:")), "slurmctld", "slurmdbd"]
        for name in order:
            _stop(pids.get(name), marker)
        _stop(_read_pid(state_dir / "munge" / "munged.pid"), str(state_dir / "munge"))
        if drop_database:
            # Its name was checked at `up`: letters, digits and underscores only.
            _run("mysql", "-uroot", "-h127.0.0.1", "-e", f"DROP DATABASE IF EXISTS `{state['database']}`", check=False)
        remove_job_cgroups(first_job_id(Ports.from_base(int(state["base_port"]))))
    if state_dir.is_dir():
        shutil.rmtree(state_dir)


def as_dict(slurm: LocalSlurm) -> dict[str, str]:
    return {key: str(value) for key, value in asdict(slurm).items()}
