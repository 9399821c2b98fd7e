"""Small helpers the integration tests share: code directories, waiting on jobs, looking at the nodes."""

import asyncio
import json
import shutil
import time
from pathlib import Path

import asyncssh
from django.conf import settings

from jobs.code_dirs.service import register
from jobs.models import FINAL_STATES, TrainingJob

CLUSTER_NODES = 2
CLUSTER_SLOTS = 2
BASE_DIR = Path(__file__).resolve().parents[2]
TEST_OUTPUT = BASE_DIR / "test-output"
PROGRAMS = Path(__file__).resolve().parent / "programs"


def code_dir_from_program(name: str, program: str):
    """A code directory holding one of tests/integration/programs as its boot file."""
    root = Path(settings.CODE_DIRS_ROOT) / name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    shutil.copy(PROGRAMS / program, root / program)
    return register(name, root, sharing="everyone")


def submit_program(api, program: str, node_count: int = CLUSTER_NODES, **fields) -> TrainingJob:
    """Submit one of tests/integration/programs, in a code directory of its name, as a job of the console
    fixture's engine; `fields` lay over the API's submission body."""
    name = program.removesuffix(".py")
    code_dir_from_program(name, program)
    body = {"name": name.replace("_", "-"), "engine": "local-mpi4py", "spec": "local-cpu", "node_count": node_count,
            "code_dir": name, "boot_file": program, **fields}
    response = api.post("/api/v1/training-jobs", body, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


def wait_for(job: TrainingJob, statuses, timeout: float = 120) -> TrainingJob:
    wanted = {str(status) for status in statuses}
    deadline = time.monotonic() + timeout
    while True:
        job.refresh_from_db()
        if job.status in wanted:
            return job
        if job.status in FINAL_STATES and job.status not in wanted:
            raise AssertionError(f"job ended {job.status} ({job.status_message}) while waiting for {wanted}:\n{log_text(job)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"job still {job.status} after {timeout} s, waiting for {wanted}:\n{log_text(job)}")
        time.sleep(0.2)


def log_text(job: TrainingJob) -> str:
    return "\n".join(f"{line.stream}|{line.worker_index}|{line.rank}| {line.text}" for line in job.log_lines.order_by("seq"))


def rank_lines(job: TrainingJob) -> list:
    return list(job.log_lines.filter(rank__isnull=False).order_by("seq"))


def reports(job: TrainingJob, prefix: str) -> list[dict]:
    """The JSON objects the ranks printed after `prefix `, by the rank each names (in the log's order where
    none does); other lines with the prefix are left out."""
    found = [json.loads(line.text.removeprefix(prefix + " ")) for line in rank_lines(job)
             if line.text.startswith(prefix + " {")]
    return sorted(found, key=lambda report: report.get("rank", 0))


def wait_for_reports(job: TrainingJob, prefix: str, count: int = 1, timeout: float = 180) -> list[dict]:
    """`reports`, once there are `count` of them; the job's end or the timeout before that fails the test."""
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


async def _node_run(node, command: str) -> str:
    async with asyncssh.connect(
        node.address,
        port=node.ssh_port,
        username=node.ssh_user,
        client_keys=[asyncssh.import_private_key(node.private_key_path.read_text())],
        known_hosts=asyncssh.import_known_hosts(f"{node.address} {node.host_public_key}\n"),
    ) as connection:
        return (await connection.run(command, check=True)).stdout


def on_node(local_node, command: str) -> str:
    """What a command run as root on a node of the local cluster printed (a failure raises)."""
    return asyncio.run(_node_run(local_node, command))


def processes_of_job_on_node(local_node, job: TrainingJob) -> list[str]:
    """Processes on a node that belong to the job: its container's sshd, or anything with its environment."""
    marker = f"{job.dns_name}-worker-"
    command = (
        "for p in /proc/[0-9]*; do "
        f"if grep -qa -- '{marker}' $p/environ $p/cmdline 2>/dev/null; then "
        "echo \"$(basename $p) $(tr '\\0' ' ' < $p/cmdline)\"; fi; done"
    )
    output = on_node(local_node, command)
    return [line for line in output.splitlines() if line.strip() and "grep -qa" not in line and "for p in" not in line]
