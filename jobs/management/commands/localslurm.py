"""`localslurm up|down|status|token`: a real Slurm on this machine, on nodes of its own."""

import base64
import ipaddress
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from jobs import localcluster, localslurm
from jobs.management.commands.localcluster import local_spec
from jobs.models import Node, ResourcePool
from jobs.secret_box import seal_secret


def cluster_dir() -> Path:
    return Path(settings.LOCALSLURM_STATE_DIR) / "cluster"


def slurm_dir() -> Path:
    return Path(settings.LOCALSLURM_STATE_DIR) / "slurm"


POOL = "slurm"


def register(slurm: localslurm.LocalSlurm, made: list[localcluster.LocalNode], slots: int) -> ResourcePool:
    """The Slurm pool and its nodes in the console, as `localcluster up` registers its nodes: jobs submitted to
    the pool run through this Slurm."""
    key = base64.b64encode(localslurm.jwt_key(slurm.state_dir)).decode()
    # Without root, as a Slurm site's pool is: the nodes let the Slurm user in with a key of its own (the local
    # cluster's nodes do so for their job user, so a Slurm user of another name is reached as root).
    rootless = settings.LOCALSLURM_USER == localcluster.JOB_USER
    with transaction.atomic():
        pool, _ = ResourcePool.objects.update_or_create(name=POOL, defaults={
            "kind": ResourcePool.Kind.PUBLIC, "backend": ResourcePool.Backend.SLURM, "slurm_url": slurm.rest_url,
            "slurm_partition": slurm.partition, "slurm_user": settings.LOCALSLURM_USER, "slurm_account": "console",
            "slurm_root_ssh": not rootless, "sealed_slurm_jwt_key": seal_secret(key), "sealed_slurm_token": ""})
        spec = local_spec(slots)
        for index, made_node in enumerate(made):
            local = localcluster.user_login(cluster_dir(), made_node) if rootless else made_node
            node, _ = Node.objects.get_or_create(name=slurm_node_name(index),
                                                 defaults={"address": local.address, "spec": spec})
            node.address, node.ssh_port, node.ssh_user = local.address, local.ssh_port, local.ssh_user
            node.private_key = local.private_key_path.read_text()
            node.host_key, node.spec, node.pool = local.host_public_key, spec, pool
            node.enabled, node.state, node.state_message = True, Node.State.READY, ""
            node.save()
    return pool


def slurm_node_name(index: int) -> str:
    # Apart from the local cluster's nodes (node-0, ...): a node's name is unique in the console.
    return f"slurm-{index}"


def bring_up(nodes: int, cpus: int, memory_gb: int) -> tuple[localslurm.LocalSlurm, list[localcluster.LocalNode]]:
    """The nodes (network namespaces with their own sshd, as the local cluster makes them), then Slurm on them."""
    made = localcluster.up(cluster_dir(), nodes, subnet=settings.LOCALSLURM_SUBNET, bridge=settings.LOCALSLURM_BRIDGE, prefix=settings.LOCALSLURM_PREFIX)
    namespaces = {entry.name: entry.namespace for entry in localcluster.status(cluster_dir())}
    gateway = str(ipaddress.ip_network(settings.LOCALSLURM_SUBNET).network_address + 1)
    slurm_nodes = [localslurm.SlurmNode(slurm_node_name(index), node.address, namespaces[node.name], cpus,
                                        memory_gb * 1024) for index, node in enumerate(made)]
    return localslurm.up(slurm_dir(), slurm_nodes, controller_address=gateway, cluster=settings.LOCALSLURM_CLUSTER,
                         base_port=settings.LOCALSLURM_BASE_PORT, users=[settings.LOCALSLURM_USER]), made


class Command(BaseCommand):
    help = "Bring up, take down or show a real Slurm (munge, slurmdbd, slurmctld, slurmrestd, slurmd) on local nodes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["up", "down", "status", "token"])
        parser.add_argument("--nodes", type=int, default=2)
        parser.add_argument("--cpus", type=int, default=4, help="the CPUs each node declares to Slurm")
        parser.add_argument("--memory-gb", type=int, default=8, help="the memory each node declares to Slurm")
        parser.add_argument("--slots", type=int, default=2, help="processes per node (the CPU spec's slots)")
        parser.add_argument("--lifespan", type=int, default=86400, help="token: seconds the token is valid")

    def handle(self, *args: object, action: str, nodes: int, cpus: int, memory_gb: int, slots: int, lifespan: int,
               **options: object) -> None:
        if action == "up":
            if min(nodes, cpus, memory_gb, slots) < 1:
                raise CommandError("--nodes, --cpus, --memory-gb and --slots must be at least 1")
            if slots > cpus:
                raise CommandError("--slots cannot be more than the --cpus each node declares to Slurm")
            try:
                slurm, made = bring_up(nodes, cpus, memory_gb)
            except (OSError, RuntimeError, ValueError) as error:
                raise CommandError(f"the local Slurm could not be brought up: {error}") from error
            pool = register(slurm, made, slots)
            self.stdout.write(f"Slurm cluster {slurm.cluster}, partition {slurm.partition}, {nodes} node(s): "
                              f"the console's pool {pool.name}\n"
                              f"REST: {slurm.rest_url} (openapi/v0.0.38), jobs submitted as {settings.LOCALSLURM_USER}\n"
                              f"a token: manage.py localslurm token; the tools: SLURM_CONF={slurm.conf} sinfo")
        elif action == "down":
            localslurm.down(slurm_dir())
            localcluster.down(cluster_dir(), bridge=settings.LOCALSLURM_BRIDGE, prefix=settings.LOCALSLURM_PREFIX)
            # The pool stays (jobs that ran in it keep naming it); its nodes go, so nothing is sent there.
            deleted, _ = Node.objects.filter(pool__name=POOL, pool__backend=ResourcePool.Backend.SLURM).delete()
            self.stdout.write(f"local Slurm removed ({deleted} node record(s) deleted)")
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
