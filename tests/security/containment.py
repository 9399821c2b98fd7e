"""What the node containment attacks share: submitting an attack program as a job, waiting for the lines it
prints, and looking at the nodes over their own SSH afterwards."""

import asyncio
import json
import time

from jobs.models import Node, TrainingJob
from tests.integration.helpers import _node_run, code_dir_from_program, log_text, rank_lines

RANKS = 4  # 2 nodes x 2 slots


def submit_attack(api, program: str, **fields) -> TrainingJob:
    """Submit one of tests/integration/programs as a 2-node job of the console fixture's engine."""
    code_dir_from_program(program.removesuffix(".py"), program)
    body = {"name": program.removesuffix(".py").replace("_", "-"), "engine": "local-mpi4py", "spec": "local-cpu",
            "node_count": 2, "code_dir": program.removesuffix(".py"), "boot_file": program, **fields}
    response = api.post("/api/v1/training-jobs", body, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


def reports(job: TrainingJob, prefix: str) -> list[dict]:
    """The JSON lines the ranks printed after `prefix `, by rank."""
    return sorted((json.loads(line.text.removeprefix(prefix + " ")) for line in rank_lines(job)
                   if line.text.startswith(prefix + " ")), key=lambda report: report["rank"])


def wait_for_reports(job: TrainingJob, prefix: str, count: int, timeout: float = 180) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = reports(job, prefix)
        if len(found) >= count:
            return found
        job.refresh_from_db()
        if job.ended_at is not None or time.monotonic() > deadline:
            raise AssertionError(f"{len(found)} of {count} {prefix} lines; job {job.status} ({job.status_message}):\n"
                                 f"{log_text(job)[-6000:]}")
        time.sleep(0.5)


def on_node(local_node, command: str) -> str:
    return asyncio.run(_node_run(local_node, command))


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
