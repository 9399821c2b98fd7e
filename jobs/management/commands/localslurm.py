"""`localslurm up|down|status|token`: a real Slurm on this machine, on nodes of its own."""

import ipaddress
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs import localcluster, localslurm

BRIDGE = "tcslbr0"
PREFIX = "tcslnode"


def cluster_dir() -> Path:
    return Path(settings.LOCALSLURM_STATE_DIR) / "cluster"


def slurm_dir() -> Path:
    return Path(settings.LOCALSLURM_STATE_DIR) / "slurm"


def bring_up(nodes: int, cpus: int, memory_gb: int) -> localslurm.LocalSlurm:
    """The nodes (network namespaces with their own sshd, as the local cluster makes them), then Slurm on them."""
    made = localcluster.up(cluster_dir(), nodes, subnet=settings.LOCALSLURM_SUBNET, bridge=BRIDGE, prefix=PREFIX)
    namespaces = {entry.name: entry.namespace for entry in localcluster.status(cluster_dir())}
    gateway = str(ipaddress.ip_network(settings.LOCALSLURM_SUBNET).network_address + 1)
    # Named apart from the local cluster's nodes (node-0, ...): a node's name is unique in the console.
    slurm_nodes = [localslurm.SlurmNode(f"slurm-{index}", node.address, namespaces[node.name], cpus, memory_gb * 1024)
                   for index, node in enumerate(made)]
    return localslurm.up(slurm_dir(), slurm_nodes, controller_address=gateway, base_port=settings.LOCALSLURM_BASE_PORT,
                         users=[settings.LOCALSLURM_USER])


class Command(BaseCommand):
    help = "Bring up, take down or show a real Slurm (munge, slurmdbd, slurmctld, slurmrestd, slurmd) on local nodes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["up", "down", "status", "token"])
        parser.add_argument("--nodes", type=int, default=2)
        parser.add_argument("--cpus", type=int, default=4, help="the CPUs each node declares to Slurm")
        parser.add_argument("--memory-gb", type=int, default=8, help="the memory each node declares to Slurm")
        parser.add_argument("--lifespan", type=int, default=86400, help="token: seconds the token is valid")

    def handle(self, *args: object, action: str, nodes: int, cpus: int, memory_gb: int, lifespan: int,
               **options: object) -> None:
        if action == "up":
            if min(nodes, cpus, memory_gb) < 1:
                raise CommandError("--nodes, --cpus and --memory-gb must be at least 1")
            try:
                slurm = bring_up(nodes, cpus, memory_gb)
            except (OSError, RuntimeError, ValueError) as error:
                raise CommandError(f"the local Slurm could not be brought up: {error}") from error
            self.stdout.write(f"Slurm cluster {slurm.cluster}, partition {slurm.partition}, {nodes} node(s)\n"
                              f"REST: {slurm.rest_url} (openapi/v0.0.38), jobs submitted as {settings.LOCALSLURM_USER}\n"
                              f"a token: manage.py localslurm token; the tools: SLURM_CONF={slurm.conf} sinfo")
        elif action == "down":
            localslurm.down(slurm_dir())
            localcluster.down(cluster_dir(), bridge=BRIDGE, prefix=PREFIX)
            self.stdout.write("local Slurm removed")
        elif action == "status":
            daemons = localslurm.status(slurm_dir())
            if not daemons:
                self.stdout.write("no local Slurm")
            for daemon in daemons:
                self.stdout.write(f"{daemon.name}: {'running' if daemon.alive else 'not running'} (pid {daemon.pid})")
        else:
            try:
                self.stdout.write(localslurm.token(slurm_dir(), settings.LOCALSLURM_USER, lifespan))
            except (OSError, RuntimeError) as error:
                raise CommandError(f"no token: {error}") from error
