"""The network half of the NCCL log collector: interfaces, IB devices, net
plugins, transports and the decision of which network NCCL used.

The collector in `nccl.parser` owns one `NetworkFacts` and hands it the INFO
messages about the network; handlers take the message text and return True
when they understood it.  It reads nothing but its own state and the line it
is given.  No Django imports.
"""

from __future__ import annotations

from collections import Counter
from typing import TypedDict

from . import patterns as P

MAX_INTERFACES = 256
MAX_KEYS = 256
IB_QUIET_STARTS = (
    "ncclIbAsyncThreadMain",
    "Got async event",
    "NCCL Dev",
    "IbDev",
    "Dev ",
    "Using Relaxed",
    "IB Device",
    "Initialized",
    "Adaptive",
    "Setting",
    "Merging",
    "Ignoring",
    "ncclIb",
    "Device",
)


class Topology(TypedDict):
    """What NCCL's topology dumps showed: how many dumps, the GPUs' and NICs' names, and
    whether NVLink or an NVSwitch appeared in any of them."""

    dumps: int
    gpus: set[str]
    nics: set[str]
    nvlink: bool
    nvswitch: bool


class NetworkFacts:
    def __init__(self) -> None:
        self.transport_counts: Counter[str] = Counter()
        self.transport_variants: Counter[str] = Counter()
        self.transport_cache: dict[str, tuple] = {}
        self.net_device_indices: dict[str, set[int]] = {}
        self.connection_nets: dict[str, None] = {}
        self.announced_nets: dict[str, None] = {}
        self.net_connections = 0
        self.gdr_connections = 0
        self.gdr_disabled = False
        self.gdr_enabled = False
        self.ib_devices: dict[tuple[str, int], dict] = {}
        self.ib_no_device = False
        self.ib_empty_list = False
        self.ib_oob: dict[tuple, dict] = {}
        self.bootstrap_ifaces: dict[tuple, dict] = {}
        self.socket_ifaces: dict[tuple, dict] = {}
        self.bootstrap_line_seen = False
        self.process_address: dict[tuple, str] = {}
        self.plugin: dict = {"state": None, "name": None, "path": None}
        self.collnet: dict | None = None
        self.nvls_used: bool | None = None
        self.channel_counts: dict[str, int] = {}
        self.ofi_provider: str | None = None
        self.fastsocket_seen = False
        self.env: dict[str, str] = {}
        self.driver_version: str | None = None
        self.connect_retries: Counter[str] = Counter()
        self.no_socket_interface = False
        self.topology: Topology = {"dumps": 0, "gpus": set(), "nics": set(), "nvlink": False, "nvswitch": False}

    def network_dispatch(self) -> dict:
        return {
            "Bootstrap": self.on_bootstrap,
            "NET": self.on_net_23,
            "NET/Socket": self.on_net_socket,
            "NET/Plugin": self.on_net_plugin,
            "Plugin": self.on_plugin_path,
            "P2P": self.on_p2p,
            "Using": self.on_using,
            "CUDA": self.on_cuda_ib_ports,
            "Call": self.on_connect_retry,
            "cudaDriverVersion": self.on_driver,
            "NVLS": self.on_nvls,
            "Sharp": self.on_sharp,
            "NET/OFI": self.on_ofi,
            "NET/FastSocket": self.on_fastsocket,
        }

    # -- interfaces and devices ------------------------------------------------
    def add_interfaces(self, table: dict, text: str, slot: tuple | None, kind: str) -> bool:
        found = P.parse_interfaces(text)
        for index, name, address in found:
            entry = table.get((name, address))
            if entry is None:
                if len(table) >= MAX_INTERFACES:
                    continue
                entry = table[(name, address)] = {"name": name, "address": address, "index": index, "hosts": []}
            if slot is not None and slot[0] not in entry["hosts"] and len(entry["hosts"]) < 32:
                entry["hosts"].append(slot[0])
        if found and slot is not None and len(self.process_address) < 10_000:
            self.process_address.setdefault((kind, slot[0], slot[1]), found[0][2])
        return bool(found)

    def add_ib_device(self, name: str, port: int, link_layer: str | None, slot: tuple | None) -> None:
        entry = self.ib_devices.get((name, port))
        if entry is None:
            if len(self.ib_devices) >= MAX_INTERFACES:
                return
            entry = self.ib_devices[(name, port)] = {"name": name, "port": port, "link_layer": None, "hosts": []}
        if link_layer and entry["link_layer"] is None:
            entry["link_layer"] = link_layer
        if slot is not None and slot[0] not in entry["hosts"] and len(entry["hosts"]) < 32:
            entry["hosts"].append(slot[0])

    def note_socket_interface_failure(self, text: str) -> None:
        if "no socket interface found" in text.lower():
            self.no_socket_interface = True

    def on_bootstrap(self, slot, tid, text) -> bool:
        self.note_socket_interface_failure(text)
        using = text.find("Using")
        if using < 0:
            return True  # timings and other bootstrap chatter
        self.bootstrap_line_seen = True
        return self.add_interfaces(self.bootstrap_ifaces, text[using + 5 :], slot, "bootstrap")

    def on_net_23(self, slot, tid, text) -> bool:
        # NCCL 2.3 "NET : Using interface enp1s0f0:100.97.70.134<0>" is its bootstrap.
        if "Using interface" not in text:
            return False
        # The same interface carries 2.3's socket transport.
        self.bootstrap_line_seen = True
        self.add_interfaces(self.socket_ifaces, text, slot, "socket")
        return self.add_interfaces(self.bootstrap_ifaces, text, slot, "bootstrap")

    def on_net_ib(self, slot, tid, text) -> bool:  # noqa: C901 - one NET/IB line's variants across NCCL versions, a branch each
        space = text.find(" ")
        body = "" if space < 0 else text[space:].lstrip(" :")
        if body.startswith("Using"):
            sideband = P.SIDEBAND_23.search(body)
            if sideband:
                if len(self.ib_oob) < MAX_INTERFACES:
                    self.ib_oob.setdefault(
                        (sideband.group(1), None),
                        {"name": sideband.group(1), "address": None, "index": None, "hosts": []},
                    )
                return True
            devices_text, _, oob_text = body.partition("OOB")
            devices = P.IB_DEVICE.findall(devices_text)
            for name, port, link_layer, _sharp in devices:
                self.add_ib_device(name, int(port), link_layer, slot)
            if not devices:
                self.ib_empty_list = True
            if oob_text:
                self.add_interfaces(self.ib_oob, oob_text, slot, "oob")
            return True
        if body.startswith("No device found"):
            self.ib_no_device = True
            return True
        if body.startswith("["):
            device = P.IB_DEVICE.search(body)
            if device:
                self.add_ib_device(device.group(1), int(device.group(2)), device.group(3), slot)
            return device is not None
        if "GPU Direct RDMA Disabled" in body:
            self.gdr_disabled = True
            return True
        if "GPU Direct RDMA Enabled" in body:
            self.gdr_enabled = True
            return True
        return body.startswith(IB_QUIET_STARTS)

    def on_net_socket(self, slot, tid, text) -> bool:
        body = text[len("NET/Socket") :].lstrip(" :")
        if body.startswith("Using"):
            if P.SOCKET_THREADS.search(body):
                return True
            return self.add_interfaces(self.socket_ifaces, body[5:], slot, "socket")
        return "interface" in body

    def on_cuda_ib_ports(self, slot, tid, text) -> bool:
        # NCCL 2.3: "CUDA Dev 0, IB Ports : mlx4_0/2(PHB)"; the link layer is not printed.
        ports = P.IB_PORTS_23.findall(text)
        for name, port in ports:
            self.add_ib_device(name, int(port), None, slot)
        return bool(ports)

    # -- plugins -------------------------------------------------------------------
    def note_plugin(self, name: str | None = None, path: str | None = None) -> None:
        self.plugin["state"] = "loaded"
        if name and not self.plugin["name"]:
            self.plugin["name"] = name
        if path and not self.plugin["path"]:
            self.plugin["path"] = path

    def on_net_plugin(self, slot, tid, text) -> bool:
        body = text[len("NET/Plugin") :].lstrip(" :")
        loaded = P.PLUGIN_LOADED.search(body)
        if loaded:
            name = P.PLUGIN_VERSION_SUFFIX.sub("", loaded.group(2).strip())[:100]
            if loaded.group(1) == "net":
                self.note_plugin(name)
            else:
                self.collnet = {**(self.collnet or {}), "plugin": name}
            return True
        not_found = ("No plugin found", "Could not find", "returned", "dlerror")
        if any(marker in body for marker in not_found) and self.plugin["state"] is None:
            self.plugin["state"] = "internal"
        return True

    def on_plugin_path(self, slot, tid, text) -> bool:
        path = text.partition(":")[2].strip()
        if path:
            self.note_plugin(path=path)
        return bool(path)

    def on_p2p(self, slot, tid, text) -> bool:
        plugin = P.P2P_PLUGIN.match(text)
        if plugin:
            self.note_plugin(plugin.group(1))
        return True

    def on_using(self, slot, tid, text) -> bool:
        match = P.USING_NETWORK.match(text)
        if match:
            raw = match.group(1).strip()[:100]
            if len(self.announced_nets) < 16:
                self.announced_nets.setdefault(P.canonical_net_name(raw), None)
            if raw not in ("IB", "Socket"):
                self.note_plugin(raw)
        return True

    def on_ofi(self, slot, tid, text) -> bool:
        provider = P.OFI_PROVIDER.search(text)
        if provider and self.ofi_provider is None:
            self.ofi_provider = provider.group(1)
        self.note_plugin("aws-ofi-nccl (Libfabric)")
        return True

    def on_fastsocket(self, slot, tid, text) -> bool:
        self.fastsocket_seen = True
        self.note_plugin("FastSocket")
        return True

    def on_sharp(self, slot, tid, text) -> bool:
        match = P.SHARP_RANK.search(text)
        if match:
            collnet = self.collnet = {"plugin": "SHARP", "devices": [], **(self.collnet or {})}
            if match.group(1) not in collnet["devices"] and len(collnet["devices"]) < 32:
                collnet["devices"].append(match.group(1))
        return match is not None

    # -- other facts -------------------------------------------------------------
    def on_connect_retry(self, slot, tid, text) -> bool:
        match = P.CONNECT_RETRY.search(text)
        if match and (match.group(1) in self.connect_retries or len(self.connect_retries) < 16):
            self.connect_retries[match.group(1)] += 1
        return match is not None

    def on_driver(self, slot, tid, text) -> bool:
        value = text.partition(" ")[2].strip()
        if not value.isdecimal():
            return False
        number = int(value)
        self.driver_version = self.driver_version or f"{number // 1000}.{number % 1000 // 10}"
        return True

    def on_nvls(self, slot, tid, text) -> bool:
        if text.startswith("NVLS comm"):
            self.nvls_used = True
        elif "not available" in text and self.nvls_used is None:
            self.nvls_used = False
        return True

    def on_env(self, text: str) -> bool:
        match = P.ENV_SETTING.match(text)
        if match and len(self.env) < MAX_KEYS:
            # "NCCL_IB_DISABLE set by environment to 0." ends with a full stop that is not part of the value.
            self.env.setdefault(match.group(1), match.group(2).strip().removesuffix(".").strip()[:200])
        return match is not None

    def on_numbered(self, text: str) -> bool:
        counts = P.CHANNEL_COUNTS.findall(text)
        if not counts:
            return P.GRAPH_PATH.match(text) is not None
        for number, kind in counts:
            self.channel_counts[kind] = max(self.channel_counts.get(kind, 0), int(number))
        if self.channel_counts.get("nvls"):
            self.nvls_used = True
        return True

    def on_topology(self, text: str) -> bool:
        topology = self.topology
        if text.startswith("==="):
            topology["dumps"] += 1
            return True
        gpu = P.TOPO_GPU.search(text)
        if gpu and len(topology["gpus"]) < MAX_KEYS:
            topology["gpus"].add(gpu.group(1).lower())
        nic = text.find("NIC/")
        if nic >= 0 and len(topology["nics"]) < MAX_KEYS:
            topology["nics"].add(text[nic + 4 :].split(" ")[0].lower())
        topology["nvlink"] = topology["nvlink"] or "NVL[" in text
        topology["nvswitch"] = topology["nvswitch"] or "NVS/" in text
        return True

    def record_transport(self, raw: str) -> str:
        cached = self.transport_cache.get(raw)
        if cached is None:
            cached = P.canonical_transport(raw)
            if len(self.transport_cache) < 4096:
                self.transport_cache[raw] = cached
        canonical, variant, device_index = cached
        self.transport_counts[canonical] += 1
        if variant in self.transport_variants or len(self.transport_variants) < MAX_KEYS:
            self.transport_variants[variant] += 1
        if canonical.startswith("NET/"):
            self.net_connections += 1
            self.connection_nets.setdefault(canonical[4:], None)
            if "GDRDMA" in variant:
                self.gdr_connections += 1
            if device_index is not None:
                indices = self.net_device_indices.setdefault(canonical, set())
                if len(indices) < 64:
                    indices.add(device_index)
        return canonical

    # -- decisions ------------------------------------------------------------------
    def decide_net(self, version: tuple[int, ...] | None) -> tuple[str | None, str | None, list[str]]:
        """Which network carried inter-node traffic, and how we know."""
        networks = list(dict.fromkeys([*self.connection_nets, *self.announced_nets]))
        for source, candidates in (("connections", self.connection_nets), ("announced", self.announced_nets)):
            if candidates:
                # Several nets means some ranks fell back; the slowest one is the story.
                return ("Socket" if "Socket" in candidates else next(iter(candidates))), source, networks
        inferred = None
        socket_is_transport = self.bootstrap_line_seen or (version is not None and version >= (2, 5))
        if self.ib_devices and not self.ib_no_device:
            inferred = "IB"
        elif self.ofi_provider or self.plugin.get("name") == "aws-ofi-nccl (Libfabric)":
            inferred = "Libfabric"
        elif self.fastsocket_seen:
            inferred = "FastSocket"
        elif self.plugin["state"] != "loaded" and (
            self.ib_no_device or self.env.get("NCCL_IB_DISABLE") == "1" or (self.socket_ifaces and socket_is_transport)
        ):
            inferred = "Socket"
        if inferred:
            networks.append(inferred)
        return inferred, ("inferred" if inferred else None), networks

    def ib_link_layer(self) -> str | None:
        layers = {d["link_layer"] for d in self.ib_devices.values() if d["link_layer"]}
        if not layers:
            return None
        return layers.pop() if len(layers) == 1 else "mixed"

    def gdrdma(self) -> bool | None:
        if self.gdr_connections or self.gdr_enabled:
            return True
        if self.net_connections or self.gdr_disabled:
            return False
        return None

    def net_detail(self, net: str | None, socket_interfaces: list[dict]) -> str | None:
        if net == "IB":
            layer = self.ib_link_layer()
            # No link layer (None) is a key like any other: it falls to the default.
            layer_names: dict[str | None, str] = {
                "IB": "InfiniBand",
                "RoCE": "RoCE",
                "mixed": "InfiniBand and RoCE ports",
            }
            kind = layer_names.get(layer, "InfiniBand or RoCE (link layer not shown)")
            devices = ", ".join(f"{d['name']}:{d['port']}" for d in list(self.ib_devices.values())[:8])
            return kind + (f" over {devices}" if devices else "")
        if net == "Socket":
            names = list(dict.fromkeys(i["name"] for i in socket_interfaces))
            text = "TCP sockets" + (f" over {', '.join(names[:8])}" if names else "")
            if any(name.startswith("ib") for name in names):
                text += " (IP over InfiniBand: the IB fabric is used through TCP, not RDMA)"
            return text
        if net == "Libfabric":
            return f"Libfabric (provider {self.ofi_provider or 'not shown'})"
        return net
