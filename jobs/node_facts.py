"""What a node's health check reports, read from its script's output, and judged against the node's spec.

Pure: the check itself (SSH to the node) is jobs.runtime.node_health; the admin's node list shows
these facts and their contradictions.
"""

import re
import shlex
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypedDict

from jobs.models import Network

if TYPE_CHECKING:
    from jobs.models import ResourceSpec

DEFAULT_SOCKET_IFNAMES = ["ib0", "bond0", "eth0"]
# Memory a kernel keeps for itself (and GB vs GiB on a flavor's label) is not a contradiction.
MEMORY_TOLERANCE = 0.9


class Gpu(TypedDict):
    model: str
    memory_mib: int


class RdmaPort(TypedDict):
    device: str
    port: str
    link_layer: str
    state: str


class SocketIfnames(TypedDict):
    wanted: list[str]
    found: list[str]


class ContainerSeen(TypedDict):
    name: str
    state: str
    # Where the container's files are on the node, from its label ("" for a container made without one).
    workdir: str


class NodeFacts(TypedDict, total=False):
    """What the last successful check found (kept in Node.health)."""

    cpu_cores: int | None
    memory_gb: float | None
    interfaces: list[str]
    socket_ifnames: SocketIfnames
    rdma: list[RdmaPort]
    gpus: list[Gpu]
    gpu_error: str
    openmpi: str | None
    python: str | None
    podman: str | None  # the container runtime's version; None when it is not installed
    images: list[str]
    cdi: bool | None  # NVIDIA's CDI spec is there, so GPUs can be given to containers (None: not asked)
    containers: list[ContainerSeen]
    # The file system that holds the jobs' work (and the inputs fetched for them): its size and what is free.
    disk_total_bytes: int | None
    disk_free_bytes: int | None


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


def _gpus(lines: list[str]) -> tuple[list[Gpu], str]:
    if lines == ["!absent"]:
        return [], ""
    if any(line.startswith("!error") for line in lines):
        return [], "nvidia-smi failed: " + " ".join(line for line in lines if not line.startswith("!error"))[:300]
    gpus: list[Gpu] = []
    for line in lines:
        name, _, memory = line.rpartition(",")
        if not name or not memory.strip().isdigit():
            return [], f"nvidia-smi said: {' '.join(lines)[:300]}"
        gpus.append(Gpu(model=name.strip(), memory_mib=int(memory.strip())))
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


def shared_interfaces(reports: Iterable[NodeFacts]) -> list[str] | None:
    """The network interfaces every node that reported its interfaces has, sorted; None when none did (nodes
    never checked: a Slurm pool's may have no facts)."""
    reported = [set(facts["interfaces"]) for facts in reports if facts and facts.get("interfaces")]
    if not reported:
        return None
    return sorted(set.intersection(*reported))


def parse_facts(output: str, wanted_ifnames: list[str]) -> NodeFacts:
    """The facts a node reported, from FACTS_SCRIPT's output, as plain JSON-ready values."""
    sections = _sections(output)
    memory_kib = _first_int(sections.get("memory", []))
    interfaces = sorted(sections.get("interfaces", []))
    rdma: list[RdmaPort] = []
    for line in sections.get("rdma", []):
        parts = line.split(maxsplit=3)
        if len(parts) >= 3:
            state = parts[3] if len(parts) == 4 else ""
            rdma.append({"device": parts[0], "port": parts[1], "link_layer": parts[2],
                         "state": state.split(":")[-1].strip()})
    gpus, gpu_error = _gpus(sections.get("gpus", ["!absent"]))
    containers = []
    for line in sections.get("containers", []):
        # NAME|WORKDIR|STATE (the state in words: "Up 2 minutes"); older nodes' scripts print "NAME STATE".
        if "|" in line:
            name, workdir, state = (line.split("|", 2) + ["", ""])[:3]
        else:
            (name, _, state), workdir = line.partition(" "), ""
        # podman prints "<no value>" for a label a container does not have.
        workdir = "" if workdir.strip().startswith("<") else workdir.strip()
        if name.strip():
            containers.append(ContainerSeen(name=name.strip(), state=state.strip(), workdir=workdir))
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
        "podman": _version(sections.get("podman", []), r"podman version\s+(\S+)"),
        "images": sorted(line for line in sections.get("images", []) if ":" in line and not line.startswith("<none>")),
        "cdi": sections["cdi"][:1] == ["yes"] if "cdi" in sections else None,
        "containers": containers,
        "disk_total_bytes": _disk(sections.get("disk", []))[0],
        "disk_free_bytes": _disk(sections.get("disk", []))[1],
    }


def _disk(lines: list[str]) -> tuple[int | None, int | None]:
    """health-facts.sh's "SIZE FREE" of the work root's file system, each None when it is not a number."""
    words = (lines[0].split() if lines else []) + ["", ""]
    total, free = (int(word) if word.isascii() and word.isdigit() and len(word) < 20 else None for word in words[:2])
    return total, free


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


def _model_matches(reported: str, promised: str) -> bool:
    # "NVIDIA-V100" is a "Tesla V100-SXM2-32GB": every distinctive word of the flavor must appear.
    words = [word for word in re.split(r"[\s_-]+", promised.upper()) if word and word not in {"NVIDIA", "TESLA", "GPU"}]
    squeezed = re.sub(r"[\s_-]+", "", reported.upper())
    return all(word in squeezed for word in words)


def spec_contradictions(facts: NodeFacts, spec: "ResourceSpec") -> list[str]:  # noqa: C901 - one check per promise of the spec
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
    ifnames = facts.get("socket_ifnames")
    if spec.network != Network.NONE and ifnames and not ifnames.get("found"):
        wanted = ",".join(ifnames.get("wanted", []))
        problems.append(f"none of the interfaces NCCL_SOCKET_IFNAME names ({wanted}) exists")
    if spec.gpu_count and gpus and facts.get("cdi") is False:
        problems.append("no CDI spec for the GPUs (run nvidia-ctk cdi generate): containers cannot get them")
    return problems


def facts_summary(facts: NodeFacts) -> str:
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
    ifnames = facts.get("socket_ifnames")
    found = ifnames.get("found") if ifnames else None
    if found:
        parts.append(",".join(found))
    active = [f"{port['device']}/{port['port']} {port['link_layer']}" for port in facts.get("rdma") or []]
    if active:
        parts.append(", ".join(active))
    if facts.get("podman"):
        images = facts.get("images") or []
        parts.append(f"Podman {facts['podman']}, {len(images)} image(s)")
    return " · ".join(parts)
