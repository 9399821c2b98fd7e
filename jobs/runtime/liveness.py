"""While a job runs: is every worker's container still there, and does every node still answer?

Open MPI notices a node that drops out only when its own timeout runs out (minutes, code 205 here), and
not at all a worker whose container died while mpirun waits on it. So every few seconds each node is
asked, over SSH as its root, whether the worker's container still runs. A container that is gone, or a
node that has not answered for `lost_after` seconds, is a lost worker: the run fails the job with the
card naming the worker and its node, as the MPI Operator fails a job whose worker pod dies.
"""

import asyncio
import logging
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncssh
from django.conf import settings

from jobs.launch.plan import WorkerPlan
from jobs.runtime.ssh import NodeError, connect

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 5.0

LostCallback = Callable[[dict[int, str]], Awaitable[None]]


@dataclass(frozen=True)
class Probe:
    """One look at one worker: its container runs, is gone, or its node could not be asked."""

    index: int
    running: bool = False
    gone: str = ""
    unreachable: str = ""


class WorkerWatch:
    def __init__(self, workers: list[WorkerPlan], on_lost: LostCallback, *,
                 interval: float | None = None, lost_after: float | None = None):
        self.workers = workers
        self.on_lost = on_lost
        self.interval = interval if interval is not None else settings.WORKER_PROBE_SECONDS
        self.lost_after = lost_after if lost_after is not None else settings.NODE_LOST_SECONDS
        self.connections: dict[int, asyncssh.SSHClientConnection] = {}
        self.silent_since: dict[int, float] = {}

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.interval)
                probes = await asyncio.gather(*(self.probe(worker) for worker in self.workers))
                lost = self.judge(probes, time.monotonic())
                if lost:
                    await self.on_lost(lost)
                    return
        finally:
            self.close()

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()
        self.connections.clear()

    async def gone_workers(self) -> dict[int, str]:
        """One look now: the workers whose container is gone (mpirun may have noticed before the watch did)."""
        try:
            probes = await asyncio.gather(*(self.probe(worker) for worker in self.workers))
        finally:
            self.close()
        return {probe.index: probe.gone for probe in probes if probe.gone}

    def judge(self, probes: list[Probe], now: float) -> dict[int, str]:
        lost: dict[int, str] = {}
        for probe in probes:
            if probe.running:
                self.silent_since.pop(probe.index, None)
            elif probe.gone:
                lost[probe.index] = probe.gone
            else:
                since = self.silent_since.setdefault(probe.index, now)
                if now - since >= self.lost_after:
                    lost[probe.index] = f"its node has not answered for {now - since:.0f} s ({probe.unreachable})"
        return lost

    async def probe(self, worker: WorkerPlan) -> Probe:
        command = shlex.join(["podman", "container", "inspect", "--format", "{{.State.Running}}", worker.container_name])
        try:
            connection = self.connections.get(worker.index)
            if connection is None:
                connection = self.connections[worker.index] = await connect(worker.node)
            result = await asyncio.wait_for(connection.run(command, check=False), PROBE_TIMEOUT_SECONDS)
        except NodeError as error:
            return Probe(worker.index, unreachable=error.reason)
        except (TimeoutError, OSError, asyncssh.Error) as error:
            self.forget(worker.index)
            return Probe(worker.index, unreachable=str(error) or type(error).__name__)
        answer = str(result.stdout or "").strip()
        if result.exit_status == 0 and answer == "true":
            return Probe(worker.index, running=True)
        if result.exit_status == 0:
            return Probe(worker.index, gone=f"its container {worker.container_name} has stopped")
        if "no such" in str(result.stderr or "").lower():
            return Probe(worker.index, gone=f"its container {worker.container_name} is gone")
        # podman itself failed (busy, storage locked): not an answer about the container.
        return Probe(worker.index, unreachable=f"podman said {str(result.stderr or '').strip()[-200:]}")

    def forget(self, index: int) -> None:
        connection = self.connections.pop(index, None)
        if connection is not None:
            connection.close()
