"""While a job runs: is every worker's container still there, does every node still answer, what does each use?

Open MPI notices a node that drops out only when its own timeout runs out (minutes, code 205 here), and
not at all a worker whose container died while mpirun waits on it. So every few seconds each node is
asked, over SSH as its root, whether the worker's container still runs. A container that is gone, or a
node that has not answered for `lost_after` seconds, is a lost worker: the run fails the job with the
card naming the worker and its node, as the MPI Operator fails a job whose worker pod dies.

The same look counts what the job's home and the container's writable layer hold on the node's disk: the
nodes' storage (overlay on ext4) has no quota to give a container, so a worker past its spec's disk limit,
or one whose node has less free than the reserve it keeps for itself (NODE_DISK_RESERVE_GB), is ended
like a lost one, and its card says "disk limit".
"""

import asyncio
import logging
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import asyncssh
from django.conf import settings

from jobs.launch.plan import WorkerPlan
from jobs.results.failure_card import DISK_LIMIT_REASON
from jobs.runtime.containers import as_node_root, gpu_indices
from jobs.runtime.preparation import NODE_SCRIPTS
from jobs.runtime.ssh import NodeError, connect

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 5.0

# The lost workers (index: why), and those of them whose node does not answer (not worth asking again now).
LostCallback = Callable[[dict[int, str], frozenset[int]], Awaitable[None]]
UsageCallback = Callable[[dict[int, "Usage"]], Awaitable[None]]
# The ranks that ended on their own while the job runs, as 0 or not (rank: how it ended).
RankEndCallback = Callable[[dict[int, "RankEnd"]], Awaitable[None]]
USAGE_SCRIPT = (NODE_SCRIPTS / "worker-usage.sh").read_text()


@dataclass(frozen=True)
class Usage:
    """What a container had used by one moment, as its cgroup counts it (CPU time is cumulative)."""

    cpu_ns: int | None = None
    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    gpu_percent: float | None = None
    gpu_memory_bytes: int | None = None
    # What the job's home and writable layer hold, the container's disk limit, and the node's free disk.
    disk_bytes: int | None = None
    disk_limit_bytes: int | None = None
    disk_free_bytes: int | None = None


def gib(size: int) -> str:
    return f"{size / 1024**3:.2f} GiB"


def past_disk_limit(usage: Usage, reserve_bytes: int) -> str:
    """Why a worker must be ended for its disk ("" when it need not): past its limit, or its node short."""
    if usage.disk_limit_bytes is None:
        return ""
    if usage.disk_bytes is not None and usage.disk_bytes > usage.disk_limit_bytes:
        return (f"{DISK_LIMIT_REASON} of {gib(usage.disk_limit_bytes)}: its home and its container's own files "
                f"hold {gib(usage.disk_bytes)}")
    if usage.disk_free_bytes is not None and usage.disk_free_bytes < reserve_bytes:
        return (f"{DISK_LIMIT_REASON}: its node's disk has {gib(usage.disk_free_bytes)} free, under the "
                f"{gib(reserve_bytes)} the node keeps for itself")
    return ""


@dataclass(frozen=True)
class RankEnd:
    """A rank that ended on its own (its agent's record: "ended with exit code 1", "ended on signal 11", or
    finished as 0), or that raised and printed nothing since (its log: "raised PermissionError: ...")."""

    rank: int
    worker: int
    how: str
    at: float  # when, in seconds since the epoch (the record's time)
    # Ended as 0: nothing is wrong with it, but it prints no more, so the watchdog must not take it as hung.
    finished: bool = False


def node_clock_offset(text: str, answered_at: float) -> float:
    """How far the console's clock is ahead of the node's, from worker-usage.sh's last "node_time=T" (its root's
    clock as the answer left) and when the answer came; 0 when the answer does not say."""
    times = [line.removeprefix("node_time=") for line in text.splitlines() if line.startswith("node_time=")]
    if not times or not (times[-1].isascii() and times[-1].isdigit() and len(times[-1]) < 12):
        return 0.0
    return answered_at - int(times[-1])


def read_rank_ends(text: str, worker: int, answered_at: float | None = None) -> list[RankEnd]:
    """worker-usage.sh's "rank-ended rank=N exit=C at=T" lines (the job's own claim: read as such), their times
    moved from the node's clock to the console's when `answered_at` is given: a node whose clock is behind
    would otherwise cut a rank's grace short by as much."""
    offset = node_clock_offset(text, answered_at) if answered_at is not None else 0.0
    return [replace(end, at=end.at + offset) for end in _rank_ends(text, worker)]


def _rank_ends(text: str, worker: int) -> list[RankEnd]:
    found = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] != "rank-ended":
            continue
        fields = dict(word.partition("=")[::2] for word in words[1:])
        rank, at = fields.get("rank", ""), fields.get("at", "")
        code, signal = fields.get("exit", ""), fields.get("signal", "")
        if not (rank.isascii() and rank.isdigit() and len(rank) < 8 and at.isascii() and at.isdigit() and len(at) < 12):
            continue
        if code == "0":
            found.append(RankEnd(int(rank), worker, "finished with exit code 0", float(at), finished=True))
        elif code.isascii() and code.isdigit() and len(code) < 4 and 0 < int(code) < 256:
            found.append(RankEnd(int(rank), worker, f"ended with exit code {int(code)}", float(at)))
        elif signal.isascii() and signal.isdigit() and len(signal) < 3 and 0 < int(signal) < 65:
            found.append(RankEnd(int(rank), worker, f"ended on signal {int(signal)}", float(at)))
    return found


@dataclass(frozen=True)
class Probe:
    """One look at one worker: its container runs (and what it uses), is gone, or its node could not be asked."""

    index: int
    running: bool = False
    gone: str = ""
    unreachable: str = ""
    usage: Usage | None = None
    # Why the worker is ended though it runs (its disk), "" when it is not.
    over_limit: str = ""
    rank_ends: tuple[RankEnd, ...] = ()


# A cgroup v1 memory limit of "none" is the largest page-aligned number; anything past 1 EiB is no limit.
NO_LIMIT = 1 << 60


def read_usage(text: str) -> tuple[str, Usage | None]:
    """worker-usage.sh's answer: its state word ("running", "stopped", "gone", "error ...") and the usage."""
    lines = text.strip().splitlines()
    state = lines[0].removeprefix("state=") if lines and lines[0].startswith("state=") else "error " + text[:200]
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if line.startswith("rank-ended "):
            continue  # read_rank_ends
        for word in line.split():
            key, _, value = word.partition("=")
            fields[key] = value

    def number(key: str) -> int | None:
        value = fields.get(key, "")
        return int(value) if value.isascii() and value.isdigit() and len(value) < 20 else None

    if state != "running":
        return state, None
    limit = number("limit")
    gpu_mem = number("gpu_mem_mib")
    return state, Usage(cpu_ns=number("cpu_ns"), memory_bytes=number("mem"),
                        memory_limit_bytes=limit if limit is not None and limit < NO_LIMIT else None,
                        gpu_percent=float(fields["gpu_util"]) if number("gpu_util") is not None else None,
                        gpu_memory_bytes=gpu_mem * 1024 * 1024 if gpu_mem is not None else None,
                        disk_bytes=number("disk"), disk_limit_bytes=number("disk_limit"),
                        disk_free_bytes=number("disk_free"))


class WorkerWatch:
    def __init__(self, workers: list[WorkerPlan], on_lost: LostCallback | None = None, *,
                 interval: float | None = None, lost_after: float | None = None,
                 on_usage: UsageCallback | None = None, on_rank_end: RankEndCallback | None = None):
        self.workers = workers
        self.on_lost = on_lost
        self.on_usage = on_usage
        self.on_rank_end = on_rank_end
        self.interval = interval if interval is not None else settings.WORKER_PROBE_SECONDS
        self.lost_after = lost_after if lost_after is not None else settings.NODE_LOST_SECONDS
        self.disk_reserve_bytes = int(settings.NODE_DISK_RESERVE_GB * 1024**3)
        self.connections: dict[int, asyncssh.SSHClientConnection] = {}
        # When each worker's node last answered, counted from when that look was asked (not from when the
        # first unanswered one gave up, which would add a timeout or two to every NODE_LOST_SECONDS).
        self.answered_at: dict[int, float] = {}
        self.unreachable: set[int] = set()

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.interval)
                asked_at = time.monotonic()
                probes = await asyncio.gather(*(self.probe(worker) for worker in self.workers))
                if self.on_usage is not None:
                    await self.on_usage({probe.index: probe.usage for probe in probes if probe.usage})
                ended = {end.rank: end for probe in probes for end in probe.rank_ends}
                if ended and self.on_rank_end is not None:
                    await self.on_rank_end(ended)
                lost = self.judge(probes, asked_at, time.monotonic())
                if lost and self.on_lost is not None:
                    await self.on_lost(lost, frozenset(self.unreachable))
                    return
        finally:
            self.close()

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()
        self.connections.clear()

    async def look_once(self) -> list[Probe]:
        """One look at every worker now, outside the watch's loop; its connections are closed after."""
        try:
            return list(await asyncio.gather(*(self.probe(worker) for worker in self.workers)))
        finally:
            self.close()

    async def gone_workers(self) -> dict[int, str]:
        """One look now: the workers whose container is gone (mpirun may have noticed before the watch did)."""
        return {probe.index: probe.gone for probe in await self.look_once() if probe.gone}

    def judge(self, probes: list[Probe], asked_at: float, now: float) -> dict[int, str]:
        """The workers lost by this look (asked at asked_at, all answered or given up by now)."""
        lost: dict[int, str] = {}
        for probe in probes:
            if probe.over_limit:
                lost[probe.index] = probe.over_limit
            elif probe.running:
                self.answered_at[probe.index] = asked_at
            elif probe.gone:
                lost[probe.index] = probe.gone
            else:
                # A worker never answered is silent since the look before this one was due.
                since = self.answered_at.setdefault(probe.index, asked_at - self.interval)
                if now - since >= self.lost_after:
                    self.unreachable.add(probe.index)
                    lost[probe.index] = f"its node has not answered for {now - since:.0f} s ({probe.unreachable})"
        return lost

    async def probe(self, worker: WorkerPlan) -> Probe:
        command = shlex.join(as_node_root(worker, ["sh", "-s", "--", worker.container_name, gpu_indices(worker.gpu_devices)]))
        try:
            connection = self.connections.get(worker.index)
            if connection is None:
                # Bounded as the look itself is: a node cut off must not make each look last SSH's own timeout.
                connection = self.connections[worker.index] = await asyncio.wait_for(
                    connect(worker.node), PROBE_TIMEOUT_SECONDS)
            result = await asyncio.wait_for(connection.run(command, input=USAGE_SCRIPT, check=False),
                                            PROBE_TIMEOUT_SECONDS)
            answered_at = time.time()
        except NodeError as error:
            return Probe(worker.index, unreachable=error.reason)
        except (TimeoutError, OSError, asyncssh.Error) as error:
            self.forget(worker.index)
            return Probe(worker.index, unreachable=str(error) or type(error).__name__)
        state, usage = read_usage(str(result.stdout or ""))
        if state == "running":
            over_limit = past_disk_limit(usage, self.disk_reserve_bytes) if usage else ""
            return Probe(worker.index, running=True, usage=usage, over_limit=over_limit,
                         rank_ends=tuple(read_rank_ends(str(result.stdout or ""), worker.index, answered_at)))
        if state == "stopped":
            return Probe(worker.index, gone=f"its container {worker.container_name} has stopped")
        if state == "gone":
            return Probe(worker.index, gone=f"its container {worker.container_name} is gone")
        # podman itself failed (busy, storage locked): not an answer about the container.
        return Probe(worker.index, unreachable=f"podman said {state.removeprefix('error').strip()}")

    def forget(self, index: int) -> None:
        connection = self.connections.pop(index, None)
        if connection is not None:
            connection.close()
