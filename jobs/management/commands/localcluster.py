"""`localcluster up|down|status`: node containers on this machine, registered as the console's nodes."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from jobs import localcluster
from jobs.models import Network, Node, ResourceSpec


def local_spec(slots: int) -> ResourceSpec:
    spec, _ = ResourceSpec.objects.get_or_create(
        name=f"local-cpu-{slots}",
        defaults={"cpu_cores": slots, "memory_gb": 4, "cpu_slots_per_node": slots, "network": Network.SOCKET},
    )
    return spec


class Command(BaseCommand):
    help = "Bring up, tear down or show a cluster of SSH nodes made of network namespaces on this machine."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["up", "down", "status"])
        parser.add_argument("--nodes", type=int, default=2)
        parser.add_argument("--slots", type=int, default=2, help="processes per node (the CPU spec's slots)")

    def cluster_options(self) -> dict:
        return {
            "subnet": settings.LOCALCLUSTER_SUBNET,
            "bridge": settings.LOCALCLUSTER_BRIDGE,
            "prefix": settings.LOCALCLUSTER_PREFIX,
        }

    def handle(self, *args, action, nodes, slots, **options):
        state_dir = settings.LOCALCLUSTER_STATE_DIR
        if action == "up":
            if nodes < 1 or slots < 1:
                raise CommandError("--nodes and --slots must be at least 1")
            try:
                made = localcluster.up(state_dir, nodes, **self.cluster_options())
            except (OSError, RuntimeError) as error:
                raise CommandError(f"the local cluster could not be brought up: {error}") from error
            spec = local_spec(slots)
            with transaction.atomic():
                for local in made:
                    node, _ = Node.objects.get_or_create(
                        name=local.name, defaults={"address": local.address, "spec": spec}
                    )
                    node.address, node.ssh_port, node.ssh_user = local.address, local.ssh_port, local.ssh_user
                    node.private_key = local.private_key_path.read_text()
                    node.host_key = local.host_public_key
                    node.spec, node.enabled, node.state, node.state_message = spec, True, Node.State.READY, ""
                    node.save()
            for local in made:
                self.stdout.write(f"{local.name} {local.address}:{local.ssh_port} ({spec.display})")
        elif action == "down":
            names = [entry.name for entry in localcluster.status(state_dir)]
            localcluster.down(state_dir, **{k: v for k, v in self.cluster_options().items() if k != "subnet"})
            deleted, _ = Node.objects.filter(name__in=names).delete()
            self.stdout.write(f"local cluster removed ({deleted} node record(s) deleted)")
        else:
            for entry in localcluster.status(state_dir):
                self.stdout.write(str(entry))
