"""Teardown: end every process of a job's containers on every node, and say what could not be ended.

The stop script also prints how each rank of the worker ended (its fork agent's record), since the
records go with the container's files.
"""

import asyncio
import re
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypedDict

import asyncssh
from django.conf import settings
from django.utils import timezone

from jobs.launch.plan import WorkerPlan
from jobs.results.rank_records import RankRecord, parse_rank_records
from jobs.runtime.containers import as_node_root
from jobs.runtime.network_policy import remove_policy
from jobs.runtime.preparation import NODE_SCRIPTS
from jobs.runtime.ssh import NodeError, connect

STOP_SCRIPT = (NODE_SCRIPTS / "stop-worker.sh").read_text()
# Sent before it for a container a Slurm step started (the `slurm-step` argument): it removes the container's cgroups.
STEP_CGROUPS = (NODE_SCRIPTS / "step-cgroups.sh").read_text()
# The script's own last line; the rank records before it are the job user's words and may say anything.
LEFT_LINE = re.compile(r"^left=(\d+)$")


@dataclass(frozen=True)
class TeardownResult:
    index: int
    processes_left: int | None
    error: str = ""
    rank_records: list[RankRecord] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.processes_left == 0 and not self.error

    @property
    def problem(self) -> str:
        return "" if self.clean else (self.error or f"{self.processes_left} process(es) could not be ended")


class WorkerCleanup(TypedDict):
    worker: int
    node: str
    clean: bool
    processes_left: int | None
    problem: str


class CleanupReport(TypedDict):
    """What the teardown found on each node (kept in TrainingJob.cleanup_report)."""

    checked_at: str
    clean: bool
    workers: list[WorkerCleanup]


def _nothing_left(result: asyncssh.SSHCompletedProcess) -> bool:
    lines = str(result.stdout or "").strip().splitlines()
    return bool(lines) and lines[-1].strip() == "left=0"


async def teardown_worker(worker: WorkerPlan) -> TeardownResult:
    try:
        connection = await connect(worker.node)
        async with connection:
            # The script goes on stdin, so teardown works even where the upload never happened.
            result = await connection.run(
                shlex.join(as_node_root(worker, ["sh", "-s", "--", worker.workdir, worker.container_name,
                                                 *(["slurm-step"] if worker.rootless else [])])),
                input=STEP_CGROUPS + STOP_SCRIPT if worker.rootless else STOP_SCRIPT,
                check=False,
                timeout=settings.SSH_COMMAND_TIMEOUT,
            )
            # The network policy goes with the container: a container that outlives its teardown stays fenced.
            policy_problem = await remove_policy(connection, worker) if _nothing_left(result) else ""
    except NodeError as error:
        return TeardownResult(worker.index, None, str(error))
    except (TimeoutError, OSError, asyncssh.Error) as error:
        return TeardownResult(worker.index, None, f"{worker.node.label}: stopping the container failed: {error}")
    output = str(result.stdout or "")
    lines = output.strip().splitlines()
    left = LEFT_LINE.match(lines[-1].strip()) if lines else None
    if left:
        return TeardownResult(worker.index, int(left.group(1)), f"{worker.node.label}: {policy_problem}" if policy_problem else "",
                              rank_records=parse_rank_records(output, worker.index))
    return TeardownResult(worker.index, None, f"{worker.node.label}: stop script said {output[-500:]!r} {result.stderr!r}")


async def teardown_all(workers: list[WorkerPlan]) -> list[TeardownResult]:
    return list(await asyncio.gather(*(teardown_worker(worker) for worker in workers)))


def all_rank_records(results: list[TeardownResult]) -> list[RankRecord]:
    return [record for result in results for record in result.rank_records]


def cleanup_report(results: list[TeardownResult], node_names: dict[int, str],
                   checked_at: datetime | None = None) -> CleanupReport:
    """What the teardown found on each node, as the job page shows it."""
    workers = [
        WorkerCleanup(worker=result.index, node=node_names.get(result.index, ""), clean=result.clean,
                      processes_left=result.processes_left, problem=result.problem)
        for result in sorted(results, key=lambda result: result.index)
    ]
    return {
        "checked_at": (checked_at or timezone.now()).isoformat(),
        "clean": all(worker["clean"] for worker in workers),
        "workers": workers,
    }
