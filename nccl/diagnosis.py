"""Compare what an NCCL log shows with what the job spec promised, in plain words.

`diagnose()` takes a NcclSummary (or its `to_dict()` form, e.g. read back from
the database) and returns findings sorted errors first.  Pure: no Django, no
I/O.  Finding codes are stable identifiers the UI and tests can rely on; the
wording lives in MESSAGES so it can be improved without touching the logic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .patterns import is_link_local, is_suspicious_interface

PROMISED_NETWORKS = ("none", "socket", "ib", "roce")
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
PROMISE_LABELS = {"ib": "InfiniBand", "roce": "RoCE", "socket": "TCP sockets", "none": "no inter-node network"}

MESSAGES = {
    "network-as-promised": "NCCL used {detail} between nodes, as the spec promises.",
    "no-network-promised": "No fast inter-node network is promised{used}.",
    "socket-fallback": "The spec promises {label}, but NCCL sent inter-node traffic over TCP sockets{over}.{why} "
    "Expect a fraction of the promised bandwidth.",
    "roce-expected-infiniband-used": "The spec promises RoCE but the HCAs NCCL used are InfiniBand ports ({detail}).",
    "infiniband-expected-roce-used": "The spec promises InfiniBand but NCCL used RoCE (RDMA over Ethernet) ports "
    "({detail}).",
    "mixed-link-layers": "NCCL used a mix of InfiniBand and RoCE ports ({detail}); the spec promises {label}.",
    "network-not-shown": "The log does not show which network NCCL used between nodes, so the promise of {label} "
    "cannot be checked. Run with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET) to see it.",
    "unexpected-network": "NCCL used {detail} between nodes, but the spec promises {label}.",
    "no-gdrdma": "NCCL used RDMA without GPUDirect RDMA, so data is staged through host memory. Load the "
    "nvidia-peermem (nv_peer_mem) module if the GPUs and HCAs support it.",
    "single-node": "Single-node job: NCCL keeps traffic inside the machine (P2P, SHM, NVLS), so the promised "
    "{label} is not exercised{transports}.",
    "intra-node-over-network": "{count} channel connection(s) between GPUs on the same host went through the "
    "network transport instead of P2P or shared memory. Typical causes: containers without --ipc=host, "
    "NCCL_P2P_DISABLE/NCCL_SHM_DISABLE, or each GPU in its own container.",
    "no-socket-interface": 'NCCL found no network interface it may use ("no socket interface found"). {wanted}'
    "Check `ip addr` on every node and set NCCL_SOCKET_IFNAME to a prefix that matches (e.g. eth, ens, ib).",
    "loopback-interface": "NCCL uses the loopback interface {interfaces}: other nodes cannot reach 127.0.0.1. Set "
    "NCCL_SOCKET_IFNAME to the interface that carries the node's address.",
    "virtual-interface-used": "NCCL uses a container or virtual bridge interface: {interfaces}. Such interfaces "
    "(docker0, virbr0, veth*) usually do not reach other nodes; set NCCL_SOCKET_IFNAME to the physical interface.",
    "virtual-interface-listed": "NCCL also listed virtual interfaces: {interfaces}. With NET/Socket it spreads "
    "traffic over every listed interface; exclude them with NCCL_SOCKET_IFNAME (e.g. ^docker,veth,virbr,lo).",
    "link-local-address": "NCCL uses an IPv6 link-local address: {interfaces}. Link-local addresses only work on "
    "one link segment, so other nodes may not reach them; prefer an interface with a routable address (or "
    "NCCL_SOCKET_FAMILY=AF_INET).",
    "duplicate-gpu": "Two or more ranks ran on the same GPU ({pairs}). Each rank needs its own GPU: map the local "
    "rank to a device (torch.cuda.set_device(local_rank), hvd.local_rank()) and check CUDA_VISIBLE_DEVICES.",
    "shared-hostname": "All NCCL lines name the host {host}, but they come from {count} different addresses: the "
    "machines share a host name. Give each node a unique host name to keep logs readable.",
    "single-host": "The job asked for {nodes} nodes, but every NCCL line comes from the host {host} ({count} "
    "processes). Either all ranks were started on one machine, or the other nodes' output is missing from this log.",
    "fewer-nodes": "NCCL counted {nnodes} node(s) in its communicator, but the job asked for {nodes}.",
    "fewer-ranks": "The largest NCCL communicator has {nranks} rank(s), but the job expected {expected}: some "
    "processes never joined (check the launcher's process count and per-node GPU count).",
    "more-ranks": "NCCL saw {nranks} ranks, more than the {expected} the job expected.",
    "rank-count-not-shown": "The log does not print the communicator size; it shows {seen} of the {expected} "
    "expected ranks.",
    "init-incomplete": "NCCL initialisation did not finish: {complete} of {started} communicator(s) reached Init "
    "COMPLETE. Ranks that never finish init usually wait for a peer that crashed, cannot be reached, or was never "
    "started.",
    "communicator-aborted": "{count} communicator(s) were aborted (Abort COMPLETE): a collective failed or timed "
    "out and the program tore NCCL down; the first error is the cause.",
    "mixed-versions": "Several NCCL versions appear in the log ({versions}); every rank should load the same NCCL.",
    "connect-retries": "NCCL had to retry TCP connections to other ranks ({counts}). 'Connection refused' means the "
    "peer was not listening yet or at all; 'timed out' means packets are dropped (wrong interface or firewall).",
    "nccl-result": "{text}: {hint}. The WARN lines before it name the cause.",
    "nccl-error": "The program stopped on an NCCL error: {errors}",
}
WARN_EXPLANATIONS = {
    "ibv-call-failed": "An InfiniBand verbs call failed, so NCCL could not create the queues it needs on the HCA. "
    "Usual causes: the locked-memory limit is too low (ulimit -l must be unlimited; in containers use --ulimit "
    "memlock=-1), /dev/infiniband is not available inside the container, the HCA ran out of resources, or on RoCE "
    "a wrong GID index (NCCL_IB_GID_INDEX).",
    "ib-completion-error": "An InfiniBand transfer completed with an error: the link or a peer failed during the "
    "transfer (port flapping, congestion without PFC/ECN on RoCE, or a crashed peer).",
    "libfabric": "The AWS OFI plugin (libfabric/EFA) failed. Check that the EFA device is visible (fi_info -p efa), "
    "that the security group lets the instances send all traffic to each other, and that the aws-ofi-nccl, "
    "libfabric and NCCL versions match.",
    "sharp": "SHARP in-network reductions (the CollNet plugin) could not be set up. NCCL carries on without SHARP, so "
    "the job runs, just without in-network reductions. Check the SHARP aggregation manager and that every node "
    "uses the same HPC-X/SHARP libraries, or set NCCL_COLLNET_ENABLE=0.",
    "fastsocket": "The GCP FastSocket plugin reported a retry or CPU-affinity problem. These messages are usually "
    "harmless and the job continues.",
    "topology-realpath": "NCCL could not resolve a GPU's or NIC's PCI path under /sys while detecting the topology, "
    "and gave up. This happens under WSL2, in VMs and in containers whose /sys hides the PCI tree; run with the "
    "host's /sys or give NCCL a topology file (NCCL_TOPO_FILE).",
    "connection-refused": "A TCP connection to another rank was refused: nothing listened at that address and port. "
    "The peer (often rank 0 at MASTER_ADDR) had not started or had already exited, the address or port is wrong, "
    "or a firewall rejects it.",
    "connection-timeout": "A TCP connection to another rank timed out: packets are dropped on the way. The "
    "interface NCCL picked cannot reach the peer (set NCCL_SOCKET_IFNAME to the routable interface) or a firewall "
    "drops the traffic.",
    "connection-lost": "A connection to another rank was lost; the remote process most likely crashed or was "
    "killed. Look for the first error on the other ranks.",
    "shm-cuda-failure": "NCCL's shared-memory transport failed a CUDA call. In containers this is almost always a "
    "too small /dev/shm (Docker's default is 64 MB): run with --shm-size=1g or more, or --ipc=host.",
    "nvls-failure": "NVLink SHARP (NVLS) setup failed; the driver or fabric manager does not support the multicast "
    "objects NVLS needs. Set NCCL_NVLS_ENABLE=0 to skip NVLS.",
    "cuda-out-of-memory": "The GPU ran out of memory while NCCL allocated its buffers.",
    "cuda-failure": "A CUDA call inside NCCL failed; the GPU, driver or CUDA runtime refused the request.",
    "plugin-load": "An NCCL plugin could not be loaded. NCCL falls back to its internal code; for EFA or SHARP that "
    "means the fast path is not used.",
    "message-truncated": "Ranks called a collective with different sizes or in a different order; this is a bug in "
    "the program, not a network problem.",
    "invalid-setting": "NCCL rejected one of its environment settings.",
}
RESULT_HINTS = {
    "ncclUnhandledCudaError": "a CUDA call failed",
    "ncclSystemError": "a system or network call failed (socket, verbs, file)",
    "ncclInternalError": "NCCL hit an internal check; in practice usually a failed bootstrap or peer connection",
    "ncclInvalidArgument": "the program passed an invalid argument to NCCL",
    "ncclInvalidUsage": "the program used NCCL wrongly (for example two ranks on one GPU)",
    "ncclRemoteError": "another rank failed or the network between ranks broke",
}


@dataclass(frozen=True)
class Finding:
    severity: str  # "error", "warning" or "info"
    code: str
    message: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _finding(severity: str, code: str, **values) -> Finding:
    return Finding(severity, code, MESSAGES[code].format(**values))


def _listed(items: list[str], limit: int = 6) -> str:
    return "; ".join(items[:limit]) + (" ..." if len(items) > limit else "")


def diagnose(summary, *, promised_network: str, node_count: int, expected_ranks: int | None = None) -> list[Finding]:
    """Explain the log against the spec: network promised, nodes and ranks asked for."""
    data = summary.to_dict() if hasattr(summary, "to_dict") else dict(summary)
    promise = (promised_network or "").strip().lower()
    if promise not in PROMISED_NETWORKS:
        raise ValueError(f"promised_network must be one of {PROMISED_NETWORKS}, not {promised_network!r}")
    findings = [
        *_network_findings(data, promise, node_count),
        *_interface_findings(data, node_count),
        *_placement_findings(data, node_count, expected_ranks),
        *_init_findings(data),
        *_warning_findings(data),
        *_error_findings(data),
    ]
    return sorted(findings, key=lambda finding: SEVERITY_ORDER[finding.severity])


def _network_findings(data: dict, promise: str, node_count: int) -> list[Finding]:  # noqa: C901 - one finding per case, in the order a reader checks them
    net, layer = data.get("net"), data.get("ib_link_layer")
    detail, label = data.get("net_detail") or net, PROMISE_LABELS[promise]
    found = []
    if data.get("intra_host_net_connections"):
        found.append(_finding("warning", "intra-node-over-network", count=data["intra_host_net_connections"]))
    if node_count <= 1 and promise != "none":
        transports = f"; transports seen: {', '.join(data['transports'])}" if data.get("transports") else ""
        return [*found, _finding("info", "single-node", label=label, transports=transports)]
    if promise == "none":
        if net in (None, "Socket"):
            used = MESSAGES["no-network-promised"].format(used=f" and NCCL used {detail}" if net else "")
            found.append(Finding("info", "network-as-promised", used))
        else:
            found.append(_finding("info", "unexpected-network", detail=detail, label=label))
        return found
    if promise == "socket":
        if net == "Socket":
            found.append(_finding("info", "network-as-promised", detail=detail))
        elif net is not None:
            found.append(_finding("info", "unexpected-network", detail=detail, label=label))
        return found
    if net == "Socket":
        found.append(Finding("error", "socket-fallback", _socket_fallback_message(data, label)))
    elif net == "IB" and promise == "roce" and layer == "IB":
        found.append(_finding("warning", "roce-expected-infiniband-used", detail=detail))
    elif net == "IB" and promise == "ib" and layer == "RoCE":
        found.append(_finding("warning", "infiniband-expected-roce-used", detail=detail))
    elif net == "IB" and layer == "mixed":
        found.append(_finding("warning", "mixed-link-layers", detail=detail, label=label))
    elif net == "IB":
        found.append(_finding("info", "network-as-promised", detail=detail))
    elif net is None:
        found.append(_finding("warning", "network-not-shown", label=label))
    else:
        found.append(_finding("warning", "unexpected-network", detail=detail, label=label))
    if net == "IB" and data.get("gdrdma") is False:
        found.append(_finding("info", "no-gdrdma"))
    return found


def _socket_fallback_message(data: dict, label: str) -> str:
    reasons = []
    if (data.get("env") or {}).get("NCCL_IB_DISABLE") == "1":
        reasons.append("NCCL_IB_DISABLE=1 turned InfiniBand off")
    if data.get("ib_no_device"):
        reasons.append(
            'NCCL found no usable IB/RoCE device ("NET/IB : No device found"): check that the HCA and '
            "/dev/infiniband are visible where the job runs and that rdma-core is installed"
        )
        plugin = data.get("net_plugin") or {}
        if plugin.get("state") == "loaded":
            reasons.append(f"the net plugin {plugin.get('name') or plugin.get('path')} loaded but found no device")
    names = list(dict.fromkeys(i["name"] for i in data.get("socket_interfaces") or []))
    over = f" over {', '.join(names)}" if names else ""
    if any(name.startswith("ib") for name in names):
        over += " (IP over InfiniBand: the fabric is used through TCP, not RDMA)"
    why = " Why: " + "; ".join(reasons) + "." if reasons else ""
    return MESSAGES["socket-fallback"].format(label=label, over=over, why=why)


def _interface_findings(data: dict, node_count: int) -> list[Finding]:
    found = []
    if data.get("no_socket_interface"):
        wanted = (data.get("env") or {}).get("NCCL_SOCKET_IFNAME")
        hint = (
            f"NCCL_SOCKET_IFNAME={wanted} matches no interface that is up with an IP address. "
            if wanted
            else "NCCL_SOCKET_IFNAME probably names an interface that does not exist on this machine. "
        )
        found.append(_finding("error", "no-socket-interface", wanted=hint))
    multi_node = node_count > 1
    used_socket_devices = set((data.get("net_device_indices") or {}).get("NET/Socket", []))
    problems: dict[str, list[str]] = {}
    roles = (("bootstrap", "bootstrap_interfaces"), ("socket transport", "socket_interfaces"))
    for role, key in roles:
        for position, iface in enumerate(data.get(key) or []):
            # NCCL bootstraps over the first interface; NET/Socket/N uses interface [N].
            used = position == 0 or iface.get("index") in (None, 0)
            used = used or (role == "socket transport" and iface.get("index") in used_socket_devices)
            name, address = iface["name"], str(iface["address"])
            label = f"{name} ({address}) for {role}"
            if name == "lo" or address.startswith("127."):
                if multi_node:
                    problems.setdefault("loopback-interface", []).append(label)
            elif is_suspicious_interface(name):
                used_here = used and multi_node
                problems.setdefault("virtual-interface-used" if used_here else "virtual-interface-listed", []).append(
                    label
                )
            elif is_link_local(address):
                problems.setdefault("link-local-address", []).append(label)
    severities = {"virtual-interface-listed": "warning", "link-local-address": "warning"}
    for code, labels in problems.items():
        found.append(_finding(severities.get(code, "error"), code, interfaces=_listed(labels)))
    return found


def _placement_findings(data: dict, node_count: int, expected_ranks: int | None) -> list[Finding]:  # noqa: C901 - one finding per case, in the order a reader checks them
    found = []
    ranks = data.get("ranks") or []
    pairs = [
        f"ranks {d['ranks'][0]} and {d['ranks'][1]} on GPU {d['bus_id']} of {d['host']}"
        for d in data.get("duplicate_gpus") or []
    ]
    if not pairs:
        # Machines may share a host name, so a GPU is only the same GPU at the same bootstrap address too.
        by_gpu: dict[tuple, list[str]] = {}
        for r in ranks:
            if r["host"] and r["bus_id"] and r["bootstrap_address"]:
                by_gpu.setdefault((r["host"], r["bootstrap_address"], r["bus_id"]), []).append(str(r["rank"]))
        pairs = [f"ranks {', '.join(rs)} on GPU {gpu[2]} of {gpu[0]}" for gpu, rs in by_gpu.items() if len(rs) > 1]
    if pairs:
        found.append(_finding("error", "duplicate-gpu", pairs=_listed(pairs, 5)))
    hosts = data.get("hosts") or []
    if node_count > 1 and len(hosts) == 1 and (data.get("process_count") or 0) >= 2:
        first_ifaces = [i for i in data.get("bootstrap_interfaces") or [] if i.get("index") in (None, 0)]
        addresses = {i["address"] for i in first_ifaces}
        if len(addresses) >= 2:
            found.append(_finding("warning", "shared-hostname", host=hosts[0], count=len(addresses)))
        else:
            found.append(_finding("error", "single-host", nodes=node_count, host=hosts[0], count=data["process_count"]))
    nnodes = data.get("nnodes")
    if nnodes and nnodes < node_count:
        found.append(_finding("error", "fewer-nodes", nnodes=nnodes, nodes=node_count))
    nranks = data.get("nranks")
    if expected_ranks:
        if nranks is not None and nranks < expected_ranks:
            found.append(_finding("error", "fewer-ranks", nranks=nranks, expected=expected_ranks))
        elif nranks is not None and nranks > expected_ranks:
            found.append(_finding("warning", "more-ranks", nranks=nranks, expected=expected_ranks))
        elif nranks is None and len(ranks) < expected_ranks:
            found.append(_finding("info", "rank-count-not-shown", seen=len(ranks), expected=expected_ranks))
    return found


def _init_findings(data: dict) -> list[Finding]:
    comms = data.get("communicators") or {}
    found = []
    if data.get("init_complete") is False:
        started, complete = comms.get("init_started", 0), comms.get("init_complete", 0)
        found.append(_finding("error", "init-incomplete", complete=complete, started=started))
    if comms.get("aborted"):
        found.append(_finding("error", "communicator-aborted", count=comms["aborted"]))
    if len(data.get("versions") or []) > 1:
        found.append(_finding("warning", "mixed-versions", versions=", ".join(data["versions"])))
    return found


def _warning_findings(data: dict) -> list[Finding]:
    by_kind: dict[str, list[dict]] = {}
    for warning in data.get("warning_details") or []:
        by_kind.setdefault(warning["kind"], []).append(warning)
    found = []
    for kind, warnings in by_kind.items():
        if kind in ("duplicate-gpu", "no-socket-interface"):
            continue  # explained by the placement and interface findings
        first = warnings[0]
        seen = f" (seen {len(warnings)} times)" if len(warnings) > 1 else ""
        message = f'NCCL warned on {first["host"]}{seen}: "{first["message"]}".'
        if kind in WARN_EXPLANATIONS:
            message += " " + WARN_EXPLANATIONS[kind]
        found.append(Finding("error" if first["fatal"] else "warning", f"warn-{kind}", message))
    retries = data.get("connect_retries") or {}
    if retries:
        counts = ", ".join(f"{reason} x{count}" for reason, count in retries.items())
        found.append(_finding("warning", "connect-retries", counts=counts))
    return found


def _error_findings(data: dict) -> list[Finding]:
    found = []
    program_errors = []
    for error in data.get("error_details") or []:
        if error["kind"] == "code":
            hint = RESULT_HINTS.get(error["text"].split(":", 1)[0], "NCCL returned an error")
            found.append(_finding("error", "nccl-result", text=error["text"], hint=hint))
        elif error["kind"] == "text":
            program_errors.append(error["text"])
    if program_errors:
        found.append(_finding("error", "nccl-error", errors=" | ".join(program_errors[:5])))
    return found
