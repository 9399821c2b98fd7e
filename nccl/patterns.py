"""Regular expressions and small pure helpers for reading NCCL debug logs.

Kept apart from the parser so the parser reads as a list of facts to collect,
and so the diagnosis module can share the WARN classification without
importing the streaming machinery.  No Django imports here.
"""

from __future__ import annotations

import re

# Lines may be 64K characters of anything, so every pattern here must run in
# linear time: no nested quantifiers that can split the same text two ways,
# no lazy group followed by "\s*$", and a word only starts after a separator
# (the lookbehinds), so a long run of letters is scanned once, not once per letter.
# ---------------------------------------------------------------------------
# Line anatomy: "<any prefix>host:pid:tid [dev] NCCL INFO <message>" or
# "<any prefix>host:pid:tid [dev] file.cc:123 NCCL WARN <message>".
# The pattern starts at ":pid" because the host name cannot be found by a
# regex alone: prefixes such as "[1,0]<stdout>:" glue onto it, so the parser
# walks back from the match to the previous space or colon instead.
HEADER = re.compile(r":(\d+):(\d+) \[(\d+)\] (?:(\S+) )?NCCL ([A-Z]+)\b ?")
# A header without a recognisable level marker: a cut or garbled NCCL line.
HEADER_ONLY = re.compile(r":\d+:\d+ \[\d+\]")
MPIRUN_TAG = re.compile(r"\[(\d+),(\d+)\]<std(?:out|err)>:")

VERSION = re.compile(r"NCCL version (\d+)\.(\d+)\.(\d+)(?:[-.]\d+)*(?:\+(\S+))?")
CUDA_SUFFIX = re.compile(r"cuda(\d+\.\d+)")

# ---------------------------------------------------------------------------
# Channel, ring and tree lines.  "via" marks a transport connection; a ring
# order is a list of bare numbers; "a -> b -> c" without "via" is a GRAPH line.
CONNECTION = re.compile(
    r"(?:Channel|Ring) (\d+)(?:/(\d+))? : (\d+)(?:\[([0-9a-fA-F]+)\])? -> (\d+)"
    r"(?:\[([0-9a-fA-F]+)\])?(?: \[(send|receive)\])? via (.+)$"
)
RING_ORDER = re.compile(r"(?:Channel|Ring) (\d+)(?:/(\d+))? :((?:\s+\d+)+)\s*$")
GRAPH_RING = re.compile(r"Ring (\d+) : (-?\d+) -> (-?\d+) -> (-?\d+)\s*$")
GRAPH_TREE = re.compile(r"Tree (\d+) : (-?\d+) -> (-?\d+) -> (-?\d+(?:/-?\d+)*)\s*$")
TREES_ITEM = re.compile(r"\[(\d+)\] (-?\d+(?:/-?\d+)*)->(-?\d+)->(-?\d+(?:/-?\d+)*)")
GRAPH_PATH = re.compile(r"\d+ : [A-Z]+/[0-9a-fA-F-]+(?: [A-Z]+/[0-9a-fA-F-]+)*$")
CHANNEL_COUNTS = re.compile(r"(\d+) (coll|collnet|nvls|p2p) channels(?! per)")
NET_TRANSPORT = re.compile(r"NET/([^/]+(?:/[^/\d][^/]*)*)/(\d+)(?:\((\d+)\))?(\S*)$")

# ---------------------------------------------------------------------------
# Communicator lifecycle: "comm 0x.. rank R nranks N cudaDev D ... - Init COMPLETE"
# (2.3 prints "- COMPLETE", 2.19+ prints "nRanks" on an extra line).
COMM = re.compile(r"comm (\S+) (?:parent \S+ )?rank (\d+) n[Rr]anks (\d+)(.*)$")
COMM_FIELD = re.compile(r"\b(cudaDev|nvmlDev|busId|commId|nNodes|localRanks|localRank) (\S+)")
COMM_EVENT = re.compile(r"- ?(Init START|Init COMPLETE|COMPLETE|Abort COMPLETE|Destroy COMPLETE|DONE)\s*$")
RANK_NRANKS = re.compile(r"\brank (\d+) n[Rr]anks (\d+)")
BARE_NRANKS = re.compile(r"^nranks (\d+)\s*$")
NCCL_TESTS_RANK = re.compile(
    r"#\s+Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([0-9a-fA-Fx:.]+)\]"
)

# ---------------------------------------------------------------------------
# Interfaces and devices.
# "[0]eth0:10.0.0.1<0>", "ib1:fe80::966d:ae03:b2:62c4%ib1<0>", "bond0.526:10.1.1.1<0>"
INTERFACE = re.compile(r"(?:\[(\d+)\])?(?<![^\s\[\]={},])([^\s\[\]:<>={},]+):([^\s<>]+)<\d+>")
IB_DEVICE = re.compile(r"(?<![\w.\-])([A-Za-z][\w.\-]*):(\d+)/(IB|RoCE)(/SHARP)?")
IB_PORTS_23 = re.compile(r"(?<![\w.\-])([A-Za-z][\w.\-]*)/(\d+)\(\w+\)")
SIDEBAND_23 = re.compile(r"Using interface (\S+) for sideband")
ENV_SETTING = re.compile(r"^(NCCL_[A-Z0-9_]+) set (?:by environment )?to (.*)$")
BACKTRACE = re.compile(r"^(\S+:\d+) -> (\d+)")
SOURCE_LOCATION = re.compile(r"^\S+\.\w+:\d+ ")
USING_NETWORK = re.compile(r"^Using (?:internal )?[Nn]etwork (.+)$")
P2P_PLUGIN = re.compile(r"^P2P plugin (?:v\d+ )?(\S+)")
PLUGIN_LOADED = re.compile(r"Loaded (net|coll|collnet) plugin (.+)$")
PLUGIN_VERSION_SUFFIX = re.compile(r" \(v\d+\)$")
OFI_PROVIDER = re.compile(r"Selected [Pp]rovider is (\S+)(?: \(found (\d+) nics?\))?")
SHARP_RANK = re.compile(r"Sharp rank \d+/\d+ initialized on (\S+)")
CONNECT_RETRY = re.compile(r"Call to connect returned (.+?), retrying")
SOCKET_THREADS = re.compile(r"Using (\d+) threads and (\d+) sockets per thread")
DUPLICATE_GPU = re.compile(r"Duplicate GPU detected : rank (\d+) and rank (\d+) both on CUDA device (\w+)")
TOPO_GPU = re.compile(r"GPU/(?:\d+-)?([0-9a-fA-F]+) \((\d+)\)")

# Lines outside the NCCL header format that still carry NCCL error text
# (PyTorch, Horovod, OneFlow exceptions).
ERROR_TEXT = re.compile(
    r"NCCL error|\bnccl(?:InternalError|SystemError|UnhandledCudaError|InvalidUsage|"
    r"InvalidArgument|RemoteError)\b|ncclCommInitRank failed|NCCL Check failed|"
    r"NCCL communicator was aborted|Watchdog caught collective operation timeout"
)

NCCL_RESULTS = {
    1: ("ncclUnhandledCudaError", "unhandled cuda error"),
    2: ("ncclSystemError", "unhandled system error"),
    3: ("ncclInternalError", "internal error"),
    4: ("ncclInvalidArgument", "invalid argument"),
    5: ("ncclInvalidUsage", "invalid usage"),
    6: ("ncclRemoteError", "remote process exited or there was a network error"),
    7: ("ncclInProgress", "NCCL operation in progress"),
}

# INFO messages (first word) that are understood but carry nothing the summary
# reports; they must not be counted as unparsed.
QUIET_FIRST_WORDS = frozenset(
    """
    Setting threadThresholds Launch Min Attribute accept connect PROFILER/Plugin
    TUNER/Plugin RAS socketStartConnect socketPollConnect socketFinalizeAccept Allocated
    MNNVL CC Pattern New Connection Enabled Symmetric DMA-BUF GDRCOPY Could Found
    Comm ncclCommDestroy ncclCommFinalize ncclCommAbort AllReduce AllGather Broadcast
    Reduce ReduceScatter Send Recv SendRecv ncclGroupEnd Proxy Memory Check Skipping
    Assigned Freed nvmlDeviceGetHandleByPciBusId Dumping Graph Tuner cudaMalloc Cuda
    ncclMemAlloc Registered Unregistered NVLink Loaded
""".split()
)
TOPOLOGY_WORD_PREFIXES = ("CPU/", "GPU/", "PCI/", "NIC/", "NET/", "NVS/", "+", "===")

# WARN classification shared with the diagnosis.  Order matters: the first
# match wins, so specific kinds come before generic ones.  The flag says
# whether the WARN means the job failed (it then also appears in `errors`).
WARN_KINDS = (
    ("duplicate-gpu", re.compile(r"Duplicate GPU detected"), True),
    ("no-socket-interface", re.compile(r"no socket interface found|No usable listening interface", re.I), True),
    ("nvls-failure", re.compile(r"nvls\.\w+:\d+|NVLS|multicast", re.I), True),
    ("shm-cuda-failure", re.compile(r"shm\.\w+:\d+ .*Cuda failure"), True),
    ("ibv-call-failed", re.compile(r"\bibv_\w+ failed|Call to ibv_\w+", re.I), True),
    ("ib-completion-error", re.compile(r"Got completion .*error|IBV_WC_|wc status", re.I), True),
    ("libfabric", re.compile(r"NET/OFI|[Ll]ibfabric|\bfi_\w+\(|\bEFA\b|ofi_\w+"), True),
    ("sharp", re.compile(r"SHARP|sharp_\w+"), False),
    ("fastsocket", re.compile(r"fastsocket|Cannot get incoming CPU|Maximum retry reached", re.I), False),
    ("topology-realpath", re.compile(r"Could not find real path"), True),
    ("connection-refused", re.compile(r"Connection refused"), True),
    ("connection-timeout", re.compile(r"timed out|Connection timeout", re.I), True),
    (
        "connection-lost",
        re.compile(
            r"Connection reset|Connection closed|remote process exited|Socket recv failed"
            r"|socketProgress|Broken pipe",
            re.I,
        ),
        True,
    ),
    ("cuda-out-of-memory", re.compile(r"out of memory", re.I), True),
    ("cuda-failure", re.compile(r"Cuda failure|CUDA error|cudaError", re.I), True),
    ("plugin-load", re.compile(r"[Pp]lugin|dlopen|undefined symbol"), False),
    ("message-truncated", re.compile(r"Message truncated"), True),
    ("invalid-setting", re.compile(r"Invalid value|invalid .*NCCL_|NCCL_\w+ .*invalid", re.I), False),
)

# Container bridges, veth pairs and overlay tunnels: they rarely reach other nodes directly.
VIRTUAL_INTERFACE_PREFIXES = ("docker", "virbr", "veth", "br-", "cni", "flannel", "cali", "tunl")


def classify_warning(source: str | None, message: str) -> tuple[str, bool]:
    """Return (kind, fatal) for a WARN line; ("other", False) when unknown."""
    text = f"{source} {message[:1000]}" if source else message[:1000]
    for kind, pattern, fatal in WARN_KINDS:
        if pattern.search(text):
            return kind, fatal
    return "other", False


def normalise_bus_id(raw: str) -> str | None:
    """Write a PCI bus id the way NCCL prints busId ("0000:ca:00.0" -> "ca000")."""
    text = raw.strip().lower()
    try:
        if text.startswith("0x"):
            # nccl-tests prints only the bus number ("[0xca]").
            return format(int(text, 16) << 12, "x")
        if ":" in text:
            digits = text.replace(":", "").replace(".", "")
            if "." not in text:
                digits += "0"
            return format(int(digits, 16), "x")
        return format(int(text, 16), "x")
    except ValueError:
        return None


def looks_like_bus_id(tag: str) -> bool:
    """Channel lines print "rank[tag]": a device index in most versions, the
    bus id in 2.7-2.11.  Device indices are short decimals."""
    return len(tag) >= 3 or any(c in "abcdefABCDEF" for c in tag)


def canonical_net_name(name: str) -> str:
    """Map a net name NCCL printed ("IBext_v8", "AWS Libfabric") to one word."""
    low = name.strip().lower()
    if low.startswith("ib"):
        return "IB"
    if low == "socket":
        return "Socket"
    if "libfabric" in low or low in ("ofi", "aws-ofi"):
        return "Libfabric"
    if "fastsocket" in low:
        return "FastSocket"
    return name.strip()


def canonical_transport(raw: str) -> tuple[str, str, int | None]:
    """Return (canonical name, variant without device numbers, net device index)."""
    text = raw.strip()
    low = text.lower()
    if low.startswith("net/"):
        match = NET_TRANSPORT.match(text)
        if match:
            name = "NET/" + canonical_net_name(match.group(1))
            suffix = match.group(4) or ""
            return name, f"NET/{match.group(1)}{suffix}", int(match.group(2))
        return "NET/" + canonical_net_name(text[4:].split("/")[0]), text, None
    if low.startswith("p2p/"):
        kind = text[4:].split("/")[0]
        kind_low = kind.lower()
        if kind_low in ("ipc", "cumem", "mnnvl"):
            kind = kind.upper()
        return f"P2P/{kind}", text, None
    if "shared memory" in low or low.startswith("shm"):
        return "SHM", text, None
    if low.startswith("nvls"):
        return "NVLS", text, None
    if low.startswith("collnet") or low.startswith("coll"):
        return "CollNet", text, None
    return text.split("/")[0] or text, text, None


def parse_interfaces(text: str) -> list[tuple[int | None, str, str]]:
    """Parse "[0]eth0:10.0.0.1<0> [1]ib0:fe80::1%ib0<0>" into (index, name, address)."""
    found = []
    for match in INTERFACE.finditer(text):
        index = int(match.group(1)) if match.group(1) is not None else None
        found.append((index, match.group(2), match.group(3)))
    return found


def is_link_local(address: str) -> bool:
    low = address.lower()
    return low.startswith("fe80:") or low.startswith("169.254.")


def is_suspicious_interface(name: str) -> bool:
    """Loopback, container bridges and veth pairs do not reach other nodes."""
    return name == "lo" or name.startswith(VIRTUAL_INTERFACE_PREFIXES)
