"""Teardown: end every process of a job's containers on every node, and say what could not be ended."""

import asyncio
import shlex
from dataclasses import dataclass

import asyncssh
from django.conf import settings

from .node_preparation import NODE_SCRIPTS, WorkerPlan
from .node_ssh import NodeError, connect

STOP_SCRIPT = (NODE_SCRIPTS / "stop-container.sh").read_text()


@dataclass(frozen=True)
class TeardownResult:
    index: int
    processes_left: int | None
    error: str = ""

    @property
    def clean(self) -> bool:
        return self.processes_left == 0 and not self.error


async def teardown_worker(worker: WorkerPlan) -> TeardownResult:
    try:
        connection = await connect(worker.node)
        async with connection:
            # The script goes on stdin, so teardown works even where the upload never happened.
            result = await connection.run(
                shlex.join(["sh", "-s", "--", worker.workdir]),
                input=STOP_SCRIPT,
                check=False,
                timeout=settings.SSH_COMMAND_TIMEOUT,
            )
    except NodeError as error:
        return TeardownResult(worker.index, None, str(error))
    except (OSError, asyncssh.Error, asyncio.TimeoutError) as error:
        return TeardownResult(worker.index, None, f"{worker.node.label}: stopping the container failed: {error}")
    output = str(result.stdout or "")
    for part in output.split():
        if part.startswith("left="):
            return TeardownResult(worker.index, int(part.removeprefix("left=")))
    return TeardownResult(worker.index, None, f"{worker.node.label}: stop script said {output!r} {result.stderr!r}")


async def teardown_all(workers: list[WorkerPlan]) -> list[TeardownResult]:
    return list(await asyncio.gather(*(teardown_worker(worker) for worker in workers)))
