"""What the node containment attacks share beyond tests/integration/helpers.py (which submits an attack
program as a job and waits for the lines it prints): looking at the nodes over their own SSH afterwards."""

import time

from jobs.models import Node, TrainingJob
from tests.integration.helpers import CLUSTER_NODES, CLUSTER_SLOTS, on_node

RANKS = CLUSTER_NODES * CLUSTER_SLOTS  # an attack program runs on every slot of the cluster


def timed_on_node(local_node, command: str) -> tuple[str, float]:
    started = time.monotonic()
    answer = on_node(local_node, command)
    return answer, time.monotonic() - started


def job_containers(local_node, job: TrainingJob) -> str:
    return on_node(local_node, f"podman ps --all --quiet --filter label=training-console.job={job.pk}").strip()


def nodes_free_and_ready(timeout: float = 60) -> list[tuple[str, str, int | None]]:
    """Every node Ready and allocated to no job, waited for a little (the run frees them as it settles)."""
    deadline = time.monotonic() + timeout
    while True:
        nodes: list[tuple[str, str, int | None]] = list(
            Node.objects.order_by("name").values_list("name", "state", "allocated_to_id"))
        if all(state == Node.State.READY and job is None for _, state, job in nodes) or time.monotonic() > deadline:
            return nodes
        time.sleep(0.5)
