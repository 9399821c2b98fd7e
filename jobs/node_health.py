"""Node health: reach each node over SSH, record what it has, and decide whether it may take jobs.

A check pins the node's host key on first contact and refuses a node that later shows another.
It records GPUs, CPU cores, memory, network interfaces, RDMA devices and the Open MPI and Python
versions; what contradicts the node's spec is flagged (see `spec_contradictions`), not hidden.
Every SSH step has a timeout, and the whole check has one more, so a dead node costs seconds.

Parsing and judging are pure functions; only `probe` talks to a node and only `record` writes.
"""

import asyncio
import logging
import re
import shlex
from dataclasses import dataclass, field
from typing import Iterable

import asyncssh
from django.conf import settings
from django.utils import timezone

from .models import FINAL_STATES, LauncherDefaults, Network, Node, Worker
from .node_ssh import NodeError, SshTarget, connect, host_key_line

logger = logging.getLogger(__name__)

# nvidia-smi can hang on a GPU in a bad state; the script bounds it below this.
HEALTH_COMMAND_TIMEOUT = 30
HEALTH_CONCURRENCY = 32
DEFAULT_SOCKET_IFNAMES = ["ib0", "bond0", "eth0"]
# Memory a kernel keeps for itself (and GB vs GiB on a flavor's label) is not a contradiction.
MEMORY_TOLERANCE = 0.9

# Prints one "@@ section" header per fact, then the fact; "!absent" when a tool is not installed.
# $1 is the root of the job work directories, where an ended job's container must not linger.
FACTS_SCRIPT = r"""
echo "@@ cpu"; getconf _NPROCESSORS_ONLN 2>/dev/null || nproc
echo "@@ memory"; grep '^MemTotal:' /proc/meminfo
echo "@@ interfaces"; ls /sys/class/net
echo "@@ rdma"
for port in /sys/class/infiniband/*/ports/*; do
    [ -d "$port" ] || continue
    device=${port#/sys/class/infiniband/}; device=${device%%/*}
    echo "$device ${port##*/} $(cat "$port/link_layer" 2>/dev/null) $(cat "$port/state" 2>/dev/null)"
done
echo "@@ gpus"
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 20 nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>&1 || echo "!error $?"
else
    echo "!absent"
fi
echo "@@ openmpi"
if command -v mpirun >/dev/null 2>&1; then mpirun --version 2>&1 | head -n 1; else echo "!absent"; fi
echo "@@ python"
if command -v python3 >/dev/null 2>&1; then python3 --version 2>&1; else echo "!absent"; fi
echo "@@ containers"
for marker in "$1"/*/worker-*/container.pidns; do
    [ -f "$marker" ] || continue
    pidns=$(cat "$marker"); count=0
    for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/ns/pid" 2>/dev/null)" = "$pidns" ] && count=$((count + 1))
    done
    echo "${marker%/container.pidns} $count"
done
"""


# ---- Parsing (pure) ----

def _sections(output: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith("@@ "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None and line.strip():
            sections[current].append(line.strip())
    return sections


def _first_int(lines: list[str]) -> int | None:
    for line in lines:
        match = re.search(r"\d+", line)
        if match:
            return int(match.group())
    return None


def _gpus(lines: list[str]) -> tuple[list[dict], str]:
    if lines == ["!absent"]:
        return [], ""
    if any(line.startswith("!error") for line in lines):
        return [], "nvidia-smi failed: " + " ".join(line for line in lines if not line.startswith("!error"))[:300]
    gpus = []
    for line in lines:
        name, _, memory = line.rpartition(",")
        if not name or not memory.strip().isdigit():
            return [], f"nvidia-smi said: {' '.join(lines)[:300]}"
        gpus.append({"model": name.strip(), "memory_mib": int(memory.strip())})
    return gpus, ""


def _version(lines: list[str], pattern: str) -> str | None:
    if not lines or lines == ["!absent"]:
        return None
    match = re.search(pattern, lines[0])
    return match.group(1) if match else lines[0][:80]


def matching_interfaces(wanted: list[str], present: list[str]) -> list[str]:
    """The present interfaces NCCL would consider for NCCL_SOCKET_IFNAME=wanted (prefixes, `=exact`, `^exclude`)."""
    candidates = [name for name in present if name != "lo"]
    if wanted and wanted[0].startswith("^"):
        excluded = [wanted[0][1:], *wanted[1:]]
        return [name for name in candidates if not any(name.startswith(prefix) for prefix in excluded if prefix)]
    def matches(name: str, entry: str) -> bool:
        return name == entry[1:] if entry.startswith("=") else bool(entry) and name.startswith(entry)

    return [name for name in candidates if any(matches(name, entry) for entry in wanted)]


def parse_facts(output: str, wanted_ifnames: list[str]) -> dict:
    """The facts a node reported, from FACTS_SCRIPT's output, as plain JSON-ready values."""
    sections = _sections(output)
    memory_kib = _first_int(sections.get("memory", []))
    interfaces = sorted(sections.get("interfaces", []))
    rdma = []
    for line in sections.get("rdma", []):
        parts = line.split(maxsplit=3)
        if len(parts) >= 3:
            state = parts[3] if len(parts) == 4 else ""
            rdma.append({"device": parts[0], "port": parts[1], "link_layer": parts[2],
                         "state": state.split(":")[-1].strip()})
    gpus, gpu_error = _gpus(sections.get("gpus", ["!absent"]))
    containers = []
    for line in sections.get("containers", []):
        workdir, _, count = line.rpartition(" ")
        if count.isdigit():
            containers.append({"workdir": workdir, "processes": int(count)})
    return {
        "cpu_cores": _first_int(sections.get("cpu", [])),
        "memory_gb": round(memory_kib / 1024**2, 1) if memory_kib else None,
        "interfaces": interfaces,
        "socket_ifnames": {"wanted": wanted_ifnames, "found": matching_interfaces(wanted_ifnames, interfaces)},
        "rdma": rdma,
        "gpus": gpus,
        "gpu_error": gpu_error,
        "openmpi": _version(sections.get("openmpi", []), r"Open MPI\)?\s+v?(\S+)"),
        "python": _version(sections.get("python", []), r"Python\s+(\S+)"),
        "containers": containers,
    }


def socket_ifnames(x_args: str) -> list[str]:
    """The NCCL_SOCKET_IFNAME list jobs are launched with (the launcher defaults' -x arguments)."""
    try:
        tokens = shlex.split(x_args)
    except ValueError:
        return DEFAULT_SOCKET_IFNAMES
    for token in tokens:
        if token.startswith("NCCL_SOCKET_IFNAME="):
            return [name for name in token.split("=", 1)[1].split(",") if name]
    return DEFAULT_SOCKET_IFNAMES


# ---- Judging (pure) ----

def _model_matches(reported: str, promised: str) -> bool:
    # "NVIDIA-V100" is a "Tesla V100-SXM2-32GB": every distinctive word of the flavor must appear.
    words = [word for word in re.split(r"[\s_-]+", promised.upper()) if word and word not in {"NVIDIA", "TESLA", "GPU"}]
    squeezed = re.sub(r"[\s_-]+", "", reported.upper())
    return all(word in squeezed for word in words)


def spec_contradictions(facts: dict, spec) -> list[str]:
    """What the node reported that contradicts its spec, worded for the node list."""
    if not facts:
        return []
    problems = []
    gpus = facts.get("gpus") or []
    if spec.gpu_count:
        if facts.get("gpu_error"):
            problems.append(facts["gpu_error"])
        if len(gpus) < spec.gpu_count:
            problems.append(f"{len(gpus)} GPU(s) found, the spec promises {spec.gpu_count}")
        wrong = sorted({gpu["model"] for gpu in gpus
                        if spec.gpu_model and not _model_matches(gpu["model"], spec.gpu_model)})
        if wrong:
            problems.append(f"GPU model {', '.join(wrong)} is not the spec's {spec.gpu_model}")
    cores = facts.get("cpu_cores")
    if cores is not None and cores < spec.cpu_cores:
        problems.append(f"{cores} CPU cores found, the spec promises {spec.cpu_cores}")
    memory = facts.get("memory_gb")
    if memory is not None and memory < spec.memory_gb * MEMORY_TOLERANCE:
        problems.append(f"{memory} GB of memory found, the spec promises {spec.memory_gb} GB")
    rdma = facts.get("rdma") or []
    if spec.network == Network.INFINIBAND and not any(port["link_layer"] == "InfiniBand" for port in rdma):
        problems.append("no InfiniBand device on an InfiniBand flavor")
    if spec.network == Network.ROCE and not any(port["link_layer"] == "Ethernet" for port in rdma):
        problems.append("no RoCE device on a RoCE flavor")
    ifnames = facts.get("socket_ifnames") or {}
    if spec.network != Network.NONE and ifnames and not ifnames.get("found"):
        wanted = ",".join(ifnames.get("wanted", []))
        problems.append(f"none of the interfaces NCCL_SOCKET_IFNAME names ({wanted}) exists")
    if "openmpi" in facts and not facts["openmpi"]:
        problems.append("Open MPI (mpirun) is not installed")
    if "python" in facts and not facts["python"]:
        problems.append("python3 is not installed")
    return problems


def facts_summary(facts: dict) -> str:
    """One line for the node list: what the last check found."""
    if not facts:
        return ""
    parts = []
    gpus = facts.get("gpus") or []
    if gpus:
        models = sorted({gpu["model"] for gpu in gpus})
        memory = max(gpu["memory_mib"] for gpu in gpus) // 1024
        parts.append(f"{len(gpus)} × {'/'.join(models)} ({memory} GB)")
    if facts.get("cpu_cores") is not None:
        parts.append(f"{facts['cpu_cores']} cores")
    if facts.get("memory_gb") is not None:
        parts.append(f"{facts['memory_gb']} GB")
    found = (facts.get("socket_ifnames") or {}).get("found")
    if found:
        parts.append(",".join(found))
    active = [f"{port['device']}/{port['port']} {port['link_layer']}" for port in facts.get("rdma") or []]
    if active:
        parts.append(", ".join(active))
    if facts.get("openmpi"):
        parts.append(f"Open MPI {facts['openmpi']}")
    if facts.get("python"):
        parts.append(f"Python {facts['python']}")
    return " · ".join(parts)


def _worker_of_workdir(workdir: str) -> tuple[int, int] | None:
    # <work root>/<job dns name>/worker-<index>, the dns name ending in "-<job id>".
    match = re.search(r"-(\d+)/worker-(\d+)/?$", workdir)
    return (int(match.group(1)), int(match.group(2))) if match else None


def leftover_containers(facts: dict, node_id: int) -> list[str]:
    """This node's containers of jobs that are over but still have processes (a teardown that failed).

    Only the node's own workers count: nodes that share a filesystem (the local cluster) see each
    other's work directories.
    """
    live = {}
    for entry in facts.get("containers") or []:
        worker = _worker_of_workdir(entry["workdir"])
        if entry["processes"] and worker:
            live[worker] = f"{entry['workdir']} ({entry['processes']} process(es))"
    if not live:
        return []
    # A job is torn down before it reaches a final state, so a final job's processes are leftovers.
    ended_here = set(
        Worker.objects.filter(node_id=node_id, job_id__in={job_id for job_id, _index in live},
                              job__status__in=FINAL_STATES).values_list("job_id", "index")
    )
    return [text for worker, text in live.items() if worker in ended_here]


# ---- Talking to nodes ----

@dataclass(frozen=True)
class Probe:
    """What one check learnt: the facts, or why the node could not be checked."""

    node_id: int
    facts: dict = field(default_factory=dict)
    error: str = ""
    host_key: str = ""


async def probe(node_id: int, target: SshTarget, work_root: str, wanted_ifnames: list[str]) -> Probe:
    try:
        connection = await connect(target)
        async with connection:
            seen_key = host_key_line(connection)
            # The script goes on stdin: the command line (and every SSH log line) stays short.
            result = await connection.run(shlex.join(["sh", "-s", "--", work_root]), input=FACTS_SCRIPT,
                                          check=False, timeout=HEALTH_COMMAND_TIMEOUT)
    except NodeError as error:
        return Probe(node_id, error=str(error))
    except asyncio.TimeoutError:
        return Probe(node_id, error=f"{target.label}: health check failed: timed out after {HEALTH_COMMAND_TIMEOUT} s")
    except (OSError, asyncssh.Error) as error:
        return Probe(node_id, error=f"{target.label}: health check failed: {error or type(error).__name__}")
    if result.exit_status != 0:
        detail = str(result.stderr or "").strip()[-500:]
        return Probe(node_id, error=f"{target.label}: health check failed: exit status {result.exit_status}: {detail}")
    return Probe(node_id, facts=parse_facts(str(result.stdout or ""), wanted_ifnames), host_key=seen_key)


async def probe_all(targets: list[tuple[int, SshTarget]], work_root: str, wanted_ifnames: list[str]) -> list[Probe]:
    gate = asyncio.Semaphore(HEALTH_CONCURRENCY)
    # Each step already has its timeout; this bounds the sum, so one node can never hold the rest.
    deadline = settings.SSH_CONNECT_TIMEOUT * 2 + HEALTH_COMMAND_TIMEOUT + 5

    async def one(node_id: int, target: SshTarget) -> Probe:
        async with gate:
            try:
                return await asyncio.wait_for(probe(node_id, target, work_root, wanted_ifnames), deadline)
            except asyncio.TimeoutError:
                return Probe(node_id, error=f"{target.label}: health check failed: timed out after {deadline} s")

    return list(await asyncio.gather(*(one(node_id, target) for node_id, target in targets)))


# ---- Recording ----

@dataclass(frozen=True)
class CheckResult:
    node: str
    ready: bool
    message: str
    warnings: list[str]


def record(node: Node, result: Probe) -> CheckResult:
    """Write what a check found. Only health fields are written: the allocation is never touched."""
    now = timezone.now()
    nodes = Node.objects.filter(pk=node.pk)
    if result.error:
        nodes.update(state=Node.State.NOT_READY, state_message=result.error, last_checked_at=now,
                     last_check_message=result.error)
        return CheckResult(node.name, False, result.error, [])
    if not node.host_key and result.host_key:
        # First contact: pin what was seen, unless another check pinned a key meanwhile.
        nodes.filter(host_key="").update(host_key=result.host_key)
    leftovers = leftover_containers(result.facts, node.pk)
    warnings = spec_contradictions(result.facts, node.spec)
    if leftovers:
        state, message = Node.State.NOT_READY, "processes of ended jobs are still running: " + "; ".join(leftovers)
    else:
        state, message = Node.State.READY, ""
    summary = message or ("reachable; " + "; ".join(warnings) if warnings else "reachable, matches its spec")
    nodes.update(health=result.facts, last_seen=now, last_checked_at=now, last_check_message=summary)
    # Only if nothing else (a teardown marking the node unclean) changed the state while we looked.
    nodes.filter(state=node.state, state_message=node.state_message).update(state=state, state_message=message)
    return CheckResult(node.name, state == Node.State.READY, summary, warnings)


def target_of(node: Node) -> SshTarget:
    return SshTarget(label=node.name, address=node.address, port=node.ssh_port, username=node.ssh_user,
                     private_key=node.private_key, host_key=node.host_key)


def check_nodes(nodes: Iterable[Node]) -> list[CheckResult]:
    """Check the nodes concurrently and record each result; returns one result per node."""
    nodes = list(Node.objects.filter(pk__in=[node.pk for node in nodes]).select_related("spec"))
    targets = []
    unreadable = {}
    for node in nodes:
        try:
            targets.append((node.pk, target_of(node)))
        except ValueError as error:  # the sealed key cannot be opened (SECRET_KEY changed)
            unreadable[node.pk] = Probe(node.pk, error=f"{node.name}: {error}")
    wanted = socket_ifnames(LauncherDefaults.current().x_args)
    probes = {result.node_id: result for result in asyncio.run(probe_all(targets, settings.NODE_WORK_ROOT, wanted))}
    probes.update(unreadable)
    results = [record(node, probes[node.pk]) for node in nodes]
    if any(result.ready for result in results):
        wake_dispatcher()
    return results


def nodes_due_for_check():
    """The nodes the periodic check looks at: every enabled one, busy or not."""
    return Node.objects.filter(enabled=True)


def wake_dispatcher() -> None:
    from .tasks import dispatch_pending_jobs

    try:
        dispatch_pending_jobs.delay()
    except Exception:  # noqa: BLE001 - the periodic dispatch catches up; a check must not fail for it
        logger.warning("could not queue a dispatch after a health check", exc_info=True)
