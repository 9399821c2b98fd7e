"""The checkpoint contract on the nodes: the notice to every rank before a stop, and the watch that reads the
program's manifest in worker-0's container, uploads what it names and records it once it is in the store.

The notice goes to each rank's own process (its pid, from the rank agent's record in the job's home), from a
`podman exec` as the job's user: whatever a job wrote in that record, the signal reaches only its own
processes. The manifest is read through the container's sshd as the job's user, bounded in bytes, and
trusted only for a checkpoint whose files are really in the output folder and then in the store.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

import asyncssh
from django.conf import settings
from django.utils import timezone

from jobs.launch.checkpoint_contract import (
    MANIFEST_MAX_BYTES,
    MANIFEST_PATH,
    CheckpointClaim,
    ManifestError,
    claimed_files,
    parse_manifest,
)
from jobs.launch.plan import JobPlan, SshTarget, WorkerPlan
from jobs.runtime.containers import CONTAINER_HOME, JOB_UID
from jobs.runtime.data_out import OutputSync, bounded_run
from jobs.runtime.ssh import NodeError, connect

logger = logging.getLogger(__name__)

# Run in a worker's container as the job's user: signal each rank by the pid its agent recorded.
SIGNAL_RANKS = r"""
sig=$1 count=0
for record in "$2"/.mpi/ranks/*; do
    [ -f "$record" ] || continue
    pid=$(sed -n 's/^pid=\([0-9][0-9]*\)$/\1/p' "$record" | head -n 1)
    [ -n "$pid" ] && kill -s "$sig" "$pid" 2>/dev/null && count=$((count + 1))
done
echo "signalled=$count"
"""
# Read the manifest as the job's user: a plain file only, at most one byte past the limit.
READ_MANIFEST = f'[ -f "$1" ] && [ ! -L "$1" ] || {{ echo absent; exit 0; }}; echo present; head -c {MANIFEST_MAX_BYTES + 1} "$1"'


async def signal_worker(worker: WorkerPlan, signal: str) -> int:
    """Send `signal` to the ranks of one worker; how many got it (0 when the node or container did not answer)."""
    argv = ["podman", "exec", "--user", f"{JOB_UID}:{JOB_UID}", worker.container_name,
            "sh", "-c", SIGNAL_RANKS, "sh", signal, CONTAINER_HOME]
    try:
        connection = await connect(worker.node)
        async with connection:
            result = await connection.run(shlex.join(argv), check=False, timeout=settings.SSH_COMMAND_TIMEOUT)
    except (NodeError, TimeoutError, OSError, asyncssh.Error) as error:
        logger.info("signal %s to worker-%s: %s", signal, worker.index, error)
        return 0
    last = str(result.stdout or "").strip().splitlines()[-1:] or [""]
    return int(last[0].removeprefix("signalled=")) if last[0].startswith("signalled=") and last[0][10:].isdigit() else 0


async def signal_ranks(plan: JobPlan, signal: str) -> int:
    """Send `signal` to every rank on every worker; how many ranks got it."""
    counts = await asyncio.gather(*(signal_worker(worker, signal) for worker in plan.workers))
    return sum(counts)


async def read_manifest(target: SshTarget) -> str | None:
    """The manifest's text as the program left it; None when there is none. NodeError when it cannot be read."""
    try:
        connection = await connect(target)
        async with connection:
            text = await bounded_run(connection, ["sh", "-c", READ_MANIFEST, "sh", MANIFEST_PATH], "",
                                     limit=MANIFEST_MAX_BYTES + 64, timeout=settings.SSH_COMMAND_TIMEOUT)
    except (TimeoutError, OSError, asyncssh.Error) as error:
        raise NodeError(target.label, "reading the checkpoint manifest", str(error) or type(error).__name__) from error
    head, _, body = text.partition("\n")
    return body if head == "present" else None


@dataclass(frozen=True)
class FoundCheckpoint:
    """A claim whose files are all in the store: what the console records."""

    claim: CheckpointClaim
    url: str
    size_bytes: int
    file_count: int


Record = Callable[[FoundCheckpoint], Awaitable[None]]
Warn = Callable[[str], Awaitable[None]]


class CheckpointWatch:
    """Looks at the manifest; a new claim gets its files uploaded at once and, once they are in, recorded."""

    def __init__(self, output_sync: OutputSync, record: Record, warn: Warn):
        self.output_sync = output_sync
        self.record = record
        self.warn = warn
        # The manifest's text as last read, and the last claim recorded or refused: one look per change.
        self.last_text: str | None = None
        self.settled: CheckpointClaim | None = None
        # When the last checkpoint was recorded (a notice's grace ends when one is recorded after it).
        self.recorded_at: datetime | None = None
        # One look at a time: the notice's and the periodic one must not both record the same checkpoint.
        self.busy = asyncio.Lock()

    async def look(self) -> bool:
        """One look; True when it recorded a checkpoint. NodeError when the container cannot be asked."""
        async with self.busy:
            return await self._look()

    async def _look(self) -> bool:
        text = await read_manifest(self.output_sync.target)
        if text is None or text == self.last_text:
            return False
        try:
            claim = parse_manifest(text)
        except ManifestError as error:
            self.last_text = text
            await self.warn(str(error))
            return False
        if claim == self.settled:
            self.last_text = text
            return False
        # The files the manifest names are uploaded now, not at the next periodic upload.
        await self.output_sync.sync()
        try:
            files = claimed_files(claim, self.output_sync.found)
        except ManifestError as error:
            self.last_text, self.settled = text, claim
            await self.warn(str(error))
            return False
        missing = [path for path in files if self.output_sync.sent.get(path, (None,))[0] != files[path]
                   or path in self.output_sync.failed]
        if missing:
            return False  # not all in the store yet (an upload failed, or the file is still being written)
        self.last_text, self.settled = text, claim
        url = self.output_sync.train_url.rstrip("/") + "/" + claim.output_path
        await self.record(FoundCheckpoint(claim, url, sum(files.values()), len(files)))
        self.recorded_at = timezone.now()
        return True
