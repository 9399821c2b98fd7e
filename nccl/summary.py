"""The facts read from an NCCL log, and their human-readable rendering.

Every field holds plain JSON types so `to_dict()` can go straight into a
JSON column or an API response.  Canonical names used in the fields:

* transports: "P2P/IPC", "P2P/CUMEM", "P2P/MNNVL", "P2P/direct pointer",
  "P2P/indirect", "SHM" (also 2.4's "direct shared memory"), "NET/IB" (also
  the IBext plugin), "NET/Socket", "NET/Libfabric" (aws-ofi-nccl, e.g. EFA),
  "NET/FastSocket", "NVLS", "CollNet"; an unknown plugin keeps its own name.
* net: "IB" (InfiniBand or RoCE; see ib_link_layer), "Socket", "Libfabric",
  "FastSocket", another plugin's name, or None when the log does not show it.
  net_source says how it was learnt: "connections" (channel lines), "announced"
  ("Using network X") or "inferred" (device lists).
* communicators counts per-rank communicator handles ("comm 0x..."), the
  objects NCCL reports Init START/COMPLETE for; comm_ids lists the
  cluster-wide communicator ids NCCL >= 2.12 prints.
* ranks lists the ranks of the largest communicator seen (the job's world).
* unparsed counts NCCL-looking lines (an NCCL header or INFO/WARN marker)
  whose message the parser does not understand; parser_errors counts the
  lines among them on which the parser itself failed (a bug to report).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class NcclSummary:
    version: str | None = None
    versions: list[str] = field(default_factory=list)
    cuda_version: str | None = None
    cuda_driver_version: str | None = None
    nranks: int | None = None
    nranks_seen: list[int] = field(default_factory=list)
    nnodes: int | None = None
    hosts: list[str] = field(default_factory=list)
    process_count: int = 0
    ranks: list[dict] = field(default_factory=list)
    transports: list[str] = field(default_factory=list)
    transport_counts: dict[str, int] = field(default_factory=dict)
    transport_variants: dict[str, int] = field(default_factory=dict)
    net_device_indices: dict[str, list[int]] = field(default_factory=dict)
    net: str | None = None
    net_source: str | None = None
    networks: list[str] = field(default_factory=list)
    ib_link_layer: str | None = None
    net_detail: str | None = None
    ib_devices: list[dict] = field(default_factory=list)
    ib_no_device: bool = False
    no_socket_interface: bool = False
    ib_oob_interfaces: list[dict] = field(default_factory=list)
    gdrdma: bool | None = None
    bootstrap_interfaces: list[dict] = field(default_factory=list)
    socket_interfaces: list[dict] = field(default_factory=list)
    net_plugin: dict = field(default_factory=dict)
    collnet: dict | None = None
    nvls: bool | None = None
    channel_counts: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    init_complete: bool | None = None
    communicators: dict[str, int] = field(default_factory=dict)
    comm_ids: list[str] = field(default_factory=list)
    rings: dict = field(default_factory=dict)
    trees: dict = field(default_factory=dict)
    connected_all_rings: bool = False
    intra_host_net_connections: int = 0
    warnings: list[str] = field(default_factory=list)
    warnings_omitted: int = 0
    warning_details: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    errors_omitted: int = 0
    error_details: list[dict] = field(default_factory=list)
    error_codes: dict[str, int] = field(default_factory=dict)
    duplicate_gpus: list[dict] = field(default_factory=list)
    connect_retries: dict[str, int] = field(default_factory=dict)
    topology: dict = field(default_factory=dict)
    line_count: int = 0
    nccl_line_count: int = 0
    unparsed: dict = field(default_factory=lambda: {"count": 0, "examples": [], "parser_errors": 0})

    def to_dict(self) -> dict:
        # asdict deep-copies, so callers may mutate the result freely.
        return dataclasses.asdict(self)


def _world_ranks(records: dict, nranks: int | None) -> list[dict]:
    """Ranks of the largest communicator, completed with facts from lines that
    do not say which communicator they belong to (channel and tree lines)."""
    world = {rank: dict(record) for (size, rank), record in records.items() if size == nranks}
    if nranks is not None:
        for (size, rank), record in records.items():
            if size is not None or rank >= nranks:
                continue
            known = world.get(rank)
            if known is None:
                world[rank] = dict(record)
                continue
            if known["host"] and record["host"] and (known["host"], known["pid"]) != (record["host"], record["pid"]):
                continue  # the same rank number in another communicator
            for key, value in record.items():
                if known[key] is None:
                    known[key] = value
    return [world[rank] for rank in sorted(world)]


def _own_lists(entry: dict) -> dict:
    """A copy of an entry whose lists (an interface's hosts, CollNet's devices) are copies too."""
    return {key: list(value) if type(value) is list else value for key, value in entry.items()}


def _render_error(entry: dict) -> str:
    processes = len(entry["processes"])
    if processes > 1:
        return f"{entry['text']} [on {processes} processes]"
    if entry["count"] > 1:
        return f"{entry['text']} [{entry['count']} times]"
    return entry["text"]


def build_summary(c, n, p) -> NcclSummary:
    """Turn the collector's state into a summary: `c` the collector (nccl.parser._Collector),
    `n` its NetworkFacts, `p` its ProblemFacts.  Reads them, changes nothing, and shares no
    mutable value with them, so the summary stays as it is while the collector reads on."""
    versions = list(c.versions)
    version = versions[0] if versions else None
    version_tuple = tuple(int(part) for part in version.split(".")) if version else None
    nranks = max(c.nranks_seen) if c.nranks_seen else None
    net, net_source, networks = n.decide_net(version_tuple)
    socket_interfaces = [_own_lists(entry) for entry in n.socket_ifaces.values()]
    bootstrap_interfaces = [_own_lists(entry) for entry in n.bootstrap_ifaces.values()]
    address_kind = "bootstrap"
    if not n.bootstrap_line_seen and version_tuple is not None and version_tuple < (2, 5):
        # NCCL 2.4 printed its bootstrap interface as "NET/Socket : Using ...".
        bootstrap_interfaces, address_kind = [_own_lists(entry) for entry in socket_interfaces], "socket"
    ranks = _world_ranks(c.rank_records, nranks)
    # (host, pid, CUDA device) of each placed rank, to name the rank a warning came from.
    slot_rank: dict[tuple[str, int, int | None], int] = {}
    for record in ranks:
        if record["host"] is not None:
            slot_rank.setdefault((record["host"], record["pid"], record["cuda_dev"]), record["rank"])
            record["bootstrap_address"] = n.process_address.get((address_kind, record["host"], record["pid"]))
    host_of_rank = {record["rank"]: record["host"] for record in ranks if record["host"]}
    warnings, details = [], []
    for warning in p.warning_records:
        rank = slot_rank.get((warning["host"], warning["pid"], warning["cuda_dev"]))
        who = f"{warning['host']} pid {warning['pid']} dev {warning['cuda_dev']}"
        if rank is not None:
            who += f" (rank {rank})"
        elif warning["launcher_rank"] is not None:
            who += f" (launcher rank {warning['launcher_rank']})"
        where = f" [{warning['source']}]" if warning["source"] else ""
        warnings.append(f"{who}: {warning['message']}{where}")
        details.append({**warning, "rank": rank})
    started = [state for state in c.comms.values() if state["started"]]
    transports = set(n.transport_counts)
    if n.nvls_used:
        transports.add("NVLS")
    if n.channel_counts.get("collnet"):
        transports.add("CollNet")
    topology = dict(n.topology, gpus=sorted(n.topology["gpus"]), nics=sorted(n.topology["nics"]))
    return NcclSummary(
        version=version,
        versions=versions,
        cuda_version=c.cuda_version,
        cuda_driver_version=n.driver_version,
        nranks=nranks,
        nranks_seen=sorted(c.nranks_seen),
        nnodes=c.nnodes,
        hosts=sorted(c.hosts),
        process_count=len(c.processes),
        ranks=ranks,
        transports=sorted(transports),
        transport_counts=dict(sorted(n.transport_counts.items())),
        transport_variants=dict(sorted(n.transport_variants.items())),
        net_device_indices={name: sorted(indices) for name, indices in sorted(n.net_device_indices.items())},
        net=net,
        net_source=net_source,
        networks=networks,
        ib_link_layer=n.ib_link_layer(),
        net_detail=n.net_detail(net, socket_interfaces),
        ib_devices=[_own_lists(entry) for entry in n.ib_devices.values()],
        ib_no_device=n.ib_no_device,
        no_socket_interface=n.no_socket_interface,
        ib_oob_interfaces=[_own_lists(entry) for entry in n.ib_oob.values()],
        gdrdma=n.gdrdma(),
        bootstrap_interfaces=bootstrap_interfaces,
        socket_interfaces=socket_interfaces,
        net_plugin=dict(n.plugin),
        collnet=_own_lists(n.collnet) if n.collnet else None,
        nvls=n.nvls_used,
        channel_counts=dict(n.channel_counts),
        env=dict(sorted(n.env.items())),
        init_complete=all(state["complete"] for state in started) if started else None,
        communicators={
            "handles": len(c.comms),
            "init_started": len(started),
            "init_complete": sum(1 for state in started if state["complete"]),
            "aborted": sum(1 for state in c.comms.values() if state["aborted"]),
        },
        comm_ids=sorted(c.comm_ids),
        rings={
            "channel_count": c.ring_channel_count,
            "orders": [
                {"ranks": list(order), "channels": sorted(channels)} for order, channels in c.ring_orders.items()
            ],
            "graph_lines": c.ring_graph_lines,
        },
        trees={"lines": c.tree_lines, "channels": c.tree_channels, "graph_lines": c.tree_graph_lines},
        connected_all_rings=c.connected_all_rings,
        intra_host_net_connections=sum(1 for host, peer in c.net_peers if host_of_rank.get(peer) == host),
        warnings=warnings,
        warnings_omitted=p.warnings_total - len(warnings),
        warning_details=details,
        errors=[_render_error(entry) for entry in p.errors.values()],
        errors_omitted=p.errors_omitted,
        error_details=[
            {"kind": key[0], "text": entry["text"], "count": entry["count"], "processes": len(entry["processes"])}
            for key, entry in p.errors.items()
        ],
        error_codes=dict(p.error_codes),
        duplicate_gpus=[_own_lists(entry) for entry in p.duplicate_gpus],
        connect_retries=dict(n.connect_retries),
        topology=topology,
        line_count=c.line_count,
        nccl_line_count=c.nccl_line_count,
        unparsed={
            "count": c.unparsed_count,
            "examples": list(c.unparsed_examples),
            "parser_errors": c.parser_errors,
        },
    )


def _interfaces_text(interfaces: list[dict]) -> str:
    parts = []
    for entry in interfaces:
        hosts = entry.get("hosts") or []
        where = f" on {', '.join(hosts)}" if hosts else ""
        parts.append(f"{entry['name']} {entry['address']}{where}")
    return "; ".join(parts)


def _yes_no_unknown(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def format_summary_text(summary: NcclSummary) -> str:  # noqa: C901 - one report, section after section, in the order it reads
    """A short report a person can read in a terminal."""
    s = summary
    lines = []
    version = s.version or "unknown"
    if s.cuda_version:
        version += f" (CUDA {s.cuda_version})"
    if len(s.versions) > 1:
        version += f" -- several versions seen: {', '.join(s.versions)}"
    lines.append(f"NCCL version: {version}")
    size = f"{s.nranks} ranks" if s.nranks is not None else "rank count not shown"
    hosts = f"{len(s.hosts)} host(s): {', '.join(s.hosts[:8])}" + (" ..." if len(s.hosts) > 8 else "")
    lines.append(f"Size: {size}; {hosts}" + (f"; NCCL counted {s.nnodes} node(s)" if s.nnodes else ""))
    net = s.net or "not shown in the log"
    if s.net_detail:
        net += f" -- {s.net_detail}"
    lines.append(f"Network between nodes: {net}" + (f" [{s.net_source}]" if s.net_source else ""))
    if s.transport_counts:
        counts = ", ".join(f"{name} x{count}" for name, count in sorted(s.transport_counts.items()))
        lines.append(f"Channel connections: {counts}")
    if s.transports:
        lines.append(f"Transports: {', '.join(s.transports)}")
    if s.gdrdma is not None:
        lines.append(f"GPUDirect RDMA: {_yes_no_unknown(s.gdrdma)}")
    if s.bootstrap_interfaces:
        lines.append(f"Bootstrap interface(s): {_interfaces_text(s.bootstrap_interfaces)}")
    if s.socket_interfaces:
        lines.append(f"Socket transport interface(s): {_interfaces_text(s.socket_interfaces)}")
    if s.ib_devices:
        devices = ", ".join(f"{d['name']}:{d['port']}/{d['link_layer'] or '?'}" for d in s.ib_devices)
        lines.append(f"IB devices: {devices}")
    if s.ib_no_device:
        lines.append("NET/IB reported: No device found")
    plugin = s.net_plugin or {}
    if plugin.get("state"):
        text = plugin["state"] + (f" ({plugin['name']})" if plugin.get("name") else "")
        lines.append(f"Net plugin: {text}" + (f" from {plugin['path']}" if plugin.get("path") else ""))
    if s.collnet:
        devices = ", ".join(s.collnet.get("devices") or [])
        lines.append(f"CollNet plugin: {s.collnet.get('plugin')}" + (f" on {devices}" if devices else ""))
    if s.nvls:
        lines.append("NVLS (NVLink SHARP): in use")
    if s.intra_host_net_connections:
        lines.append(f"Connections between GPUs of one host through the network: {s.intra_host_net_connections}")
    if s.topology.get("dumps"):
        topo = s.topology
        links = ", ".join(name for name, seen in (("NVLink", topo["nvlink"]), ("NVSwitch", topo["nvswitch"])) if seen)
        lines.append(
            f"Topology: {len(topo['gpus'])} GPU(s), {len(topo['nics'])} NIC(s)" + (f", {links}" if links else "")
        )
    if s.env:
        lines.append("Environment: " + ", ".join(f"{k}={v}" for k, v in sorted(s.env.items())))
    comms = s.communicators or {}
    init = {True: "complete", False: "NOT complete", None: "not seen"}[s.init_complete]
    lines.append(
        f"Init: {init} ({comms.get('init_complete', 0)} of {comms.get('init_started', 0)} "
        f"communicator handles reached Init COMPLETE; {comms.get('aborted', 0)} aborted)"
    )
    if s.rings.get("channel_count") or s.trees.get("lines"):
        lines.append(
            f"Rings: {s.rings.get('channel_count') or '?'} channel(s), "
            f"{len(s.rings.get('orders', []))} distinct order(s); tree lines: {s.trees.get('lines', 0)}"
        )
    if s.connect_retries:
        retries = ", ".join(f"{reason} x{n}" for reason, n in s.connect_retries.items())
        lines.append(f"Connect retries: {retries}")
    lines.append(f"Warnings ({len(s.warnings) + s.warnings_omitted}):")
    lines.extend(f"  - {w}" for w in s.warnings)
    lines.append(f"Errors ({len(s.errors) + s.errors_omitted}):")
    lines.extend(f"  - {e}" for e in s.errors)
    if s.ranks:
        lines.append("Ranks:")
        for r in s.ranks[:64]:
            lines.append(
                f"  rank {r['rank']}: host {r['host'] or '?'} pid {r['pid'] or '?'} "
                f"cuda dev {'?' if r['cuda_dev'] is None else r['cuda_dev']} bus {r['bus_id'] or '?'}"
            )
        if len(s.ranks) > 64:
            lines.append(f"  ... {len(s.ranks) - 64} more")
    lines.append(
        f"Lines: {s.line_count} read, {s.nccl_line_count} from NCCL, "
        f"{s.unparsed['count']} NCCL-looking line(s) not understood"
    )
    for example in s.unparsed["examples"]:
        lines.append(f"  ? {example}")
    return "\n".join(lines) + "\n"
