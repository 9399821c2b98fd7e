"""A job's network policy on one of its nodes, as an nftables ruleset built from plain values (pure).

Nodes are exclusive to a job and its containers share the node's network (`--network host`), so the
policy is the node's own: one nftables table per worker, named after the worker's container, loaded
before the container starts and deleted at teardown (and by the node's health check once no live job
owns it). It holds two chains:

- inbound: a new connection to a port an unprivileged process can listen on (1024-65535) is let in only
  from the node itself, the console, and the job's other workers; the node's own SSH port stays open to
  everyone (the console must never be locked out of a node), as do the node's privileged ports, which
  no job process can bind.
- outbound: what the job's uid sends (the node's own services run as root and are not held) reaches
  only the job's own workers (this node included) on unprivileged ports, and the destinations the
  administrator allows (object storage, a registry, DNS); the rest is refused at once, so a job sees
  "no route to host" rather than a hang. Replies on connections let in are always allowed.
"""

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

TABLE_PREFIX = "tc_policy_"
# The ports a process without CAP_NET_BIND_SERVICE may listen on: every port a job can open.
UNPRIVILEGED_PORTS = "1024-65535"
# The transports that have ports; a job's other traffic (ICMP) is held only by the outbound chain.
PORTED_PROTOCOLS = "{ tcp, udp, udplite, sctp, dccp }"
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_LISTED_TABLE = re.compile(r"^table inet (" + re.escape(TABLE_PREFIX) + r"[A-Za-z0-9_]+)$")


class PolicyError(ValueError):
    """A destination the administrator wrote cannot be read; the message says which and why."""


@dataclass(frozen=True)
class AllowedDestination:
    """Where a job may connect beyond its own workers: a network, and optionally a port or a range of them."""

    network: Network
    first_port: int | None = None
    last_port: int | None = None

    def rule(self) -> str:
        match = f"{'ip' if self.network.version == 4 else 'ip6'} daddr {self.network.with_prefixlen}"
        if self.first_port is None:
            return f"{match} accept"
        ports = str(self.first_port) if self.first_port == self.last_port else f"{self.first_port}-{self.last_port}"
        return f"{match} meta l4proto {{ tcp, udp }} th dport {ports} accept"


def _port(text: str, line: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise PolicyError(f"{line!r}: {text!r} is not a port (1-65535)")
    return int(text)


def parse_allowed_destinations(text: str) -> list[AllowedDestination]:
    """The administrator's list, one destination a line: an address or network, then optionally a port or a
    range (`10.0.0.0/8`, `10.1.2.3 443`, `fd00::53 53`, `192.0.2.0/24 9000-9100`); '#' starts a comment."""
    destinations = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if len(words) > 2:
            raise PolicyError(f"{line!r}: give an address or network, then at most one port or range")
        try:
            network = ipaddress.ip_network(words[0], strict=False)
        except ValueError as error:
            raise PolicyError(f"{line!r}: {words[0]!r} is not an address or network") from error
        if len(words) == 1:
            destinations.append(AllowedDestination(network))
            continue
        first, _, last = words[1].partition("-")
        first_port = _port(first, line)
        last_port = _port(last, line) if last else first_port
        if last_port < first_port:
            raise PolicyError(f"{line!r}: the range ends before it starts")
        destinations.append(AllowedDestination(network, first_port, last_port))
    return destinations


def plain_address(text: str) -> Address:
    """An address as nftables matches it: an IPv4 address seen through an IPv6 socket is the IPv4 one."""
    address = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True)
class NodePolicy:
    """Everything one worker's policy is made of, as plain values."""

    table: str
    job_uid: int
    node_ssh_port: int
    worker_addresses: tuple[Address, ...]
    console_addresses: tuple[Address, ...]
    allowed: tuple[AllowedDestination, ...] = ()


def table_name(container_name: str) -> str:
    """The table of a worker's policy, named after its container (unique, and known to the teardown)."""
    name = TABLE_PREFIX + container_name.replace("-", "_")
    if not _TABLE_NAME.match(name):
        raise PolicyError(f"container name {container_name!r} cannot name a table")
    return name


def node_policy(container_name: str, job_uid: int, node_ssh_port: int, worker_addresses: Iterable[str],
                console_addresses: Iterable[str], allowed: Sequence[AllowedDestination] = ()) -> NodePolicy:
    return NodePolicy(
        table=table_name(container_name),
        job_uid=job_uid,
        node_ssh_port=node_ssh_port,
        worker_addresses=tuple(sorted(set(map(plain_address, worker_addresses)), key=str)),
        console_addresses=tuple(sorted(set(map(plain_address, console_addresses)), key=str)),
        allowed=tuple(allowed),
    )


def _address_set(name: str, version: int, addresses: Iterable[Address]) -> str:
    kind = "ipv4_addr" if version == 4 else "ipv6_addr"
    elements = ", ".join(str(address) for address in addresses if address.version == version)
    return f"\tset {name} {{ type {kind};" + (f" elements = {{ {elements} }};" if elements else "") + " }"


def ruleset(policy: NodePolicy) -> str:
    """The text `nft -f` loads: the table made (or emptied and remade) in one atomic step."""
    table = f"table inet {policy.table}"
    lines = [
        # Made first, so the delete cannot fail; the whole file is one transaction, so the node never
        # goes without the policy while a second load (an auto restart on the same node) replaces it.
        f"{table} {{}}",
        f"delete {table}",
        f"{table} {{",
        _address_set("job_workers_v4", 4, policy.worker_addresses),
        _address_set("job_workers_v6", 6, policy.worker_addresses),
        _address_set("console_v4", 4, policy.console_addresses),
        _address_set("console_v6", 6, policy.console_addresses),
        "\tchain inbound {",
        "\t\ttype filter hook input priority filter; policy accept;",
        '\t\tiif "lo" accept',
        "\t\tct state established,related accept",
        f"\t\ttcp dport {policy.node_ssh_port} accept",
        "\t\tip saddr @console_v4 accept",
        "\t\tip6 saddr @console_v6 accept",
        "\t\tip saddr @job_workers_v4 accept",
        "\t\tip6 saddr @job_workers_v6 accept",
        f"\t\tmeta l4proto {PORTED_PROTOCOLS} th dport {UNPRIVILEGED_PORTS} reject with icmpx admin-prohibited",
        "\t}",
        "\tchain outbound {",
        "\t\ttype filter hook output priority filter; policy accept;",
        "\t\tct state established,related accept",
        # Only packets of the job's own sockets: the kernel's own (neighbour discovery, resets) have no owner.
        f"\t\tmeta skuid {policy.job_uid} jump job_outbound",
        "\t}",
        "\tchain job_outbound {",
        f'\t\toif "lo" meta l4proto {PORTED_PROTOCOLS} th dport {UNPRIVILEGED_PORTS} accept',
        f"\t\tip daddr @job_workers_v4 meta l4proto {PORTED_PROTOCOLS} th dport {UNPRIVILEGED_PORTS} accept",
        f"\t\tip6 daddr @job_workers_v6 meta l4proto {PORTED_PROTOCOLS} th dport {UNPRIVILEGED_PORTS} accept",
        "\t\tip daddr @job_workers_v4 icmp type echo-request accept",
        "\t\tip6 daddr @job_workers_v6 icmpv6 type echo-request accept",
        *(f"\t\t{destination.rule()}" for destination in policy.allowed),
        "\t\treject with icmpx admin-prohibited",
        "\t}",
        "}",
    ]
    return "\n".join(lines) + "\n"


def removal(tables: Iterable[str]) -> str:
    """The text `nft -f` loads to delete these tables, whether or not each is still there."""
    lines = []
    for table in tables:
        if not _TABLE_NAME.match(table):
            raise PolicyError(f"{table!r} is not a table name")
        lines += [f"table inet {table} {{}}", f"delete table inet {table}"]
    return "\n".join(lines) + "\n"


def policy_tables(listing: str) -> list[str]:
    """The policy tables in `nft list tables` output; any other table on the node is not the console's."""
    return [match.group(1) for line in listing.splitlines() if (match := _LISTED_TABLE.match(line.strip()))]
