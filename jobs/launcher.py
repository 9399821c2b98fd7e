"""Launch: run the background command on worker-0 and stream every rank's output into the job's log."""

import asyncio
import re
import shlex

import asyncssh
from asgiref.sync import sync_to_async
from django.conf import settings

from .log_store import LogRecord, append_log_lines
from .models import LogStream
from .node_preparation import JobPlan
from .node_ssh import connect

# With orte_tag_output mpirun prefixes each line with "[jobid,rank]<stream>:".
RANK_TAG = re.compile(r"^\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:(.*)$", re.DOTALL)


def parse_output_line(line: str, default_stream: str, processes_per_node: int) -> LogRecord:
    text = line.rstrip("\r\n")
    match = RANK_TAG.match(text)
    if not match:
        # mpirun's own words (failures to launch, aborts) carry no rank.
        return LogRecord(text=text, stream=default_stream)
    rank = int(match.group(2))
    stream = LogStream.STDOUT if match.group(3) == "stdout" else LogStream.STDERR
    # -map-by slot fills each host's slots in hostfile order, so a rank's worker follows from its number.
    return LogRecord(text=match.group(4), stream=stream, rank=rank, worker_index=rank // max(processes_per_node, 1))


class LogSink:
    """Buffers lines and writes them in order, in batches; a full buffer makes the reader wait (backpressure)."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self.buffer: list[LogRecord] = []
        self.lock = asyncio.Lock()
        self.store = sync_to_async(append_log_lines, thread_sensitive=True)

    async def add(self, record: LogRecord) -> None:
        self.buffer.append(record)
        if len(self.buffer) >= settings.LOG_FLUSH_MAX_LINES:
            await self.flush()

    async def flush(self) -> None:
        async with self.lock:
            batch, self.buffer = self.buffer, []
            if batch:
                await self.store(self.job_id, batch)

    async def flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(settings.LOG_FLUSH_INTERVAL_SECONDS)
            await self.flush()


async def _pump(reader: asyncssh.SSHReader, stream: str, plan: JobPlan, sink: LogSink) -> None:
    try:
        async for line in reader:
            await sink.add(parse_output_line(line, stream, plan.processes_per_node))
    except (asyncssh.Error, OSError, asyncio.IncompleteReadError):
        # The container went away under us (a stop, a lost node); what was read is already kept.
        pass


async def launch(plan: JobPlan, sink: LogSink) -> int | None:
    """Run mpirun on worker-0; return its exit code, or None when the session was cut before it ended."""
    worker0 = plan.workers[0]
    connection = await connect(plan.container_target(worker0))
    flusher = asyncio.create_task(sink.flush_periodically())
    try:
        async with connection:
            command = f"cd {shlex.quote(plan.working_dir)} && exec {shlex.join(plan.argv)}"
            process = await connection.create_process(command, encoding="utf-8", errors="replace")
            await asyncio.gather(
                _pump(process.stdout, LogStream.STDOUT, plan, sink),
                _pump(process.stderr, LogStream.STDERR, plan, sink),
            )
            try:
                await asyncio.wait_for(process.wait_closed(), timeout=10)
            except (asyncio.TimeoutError, asyncssh.Error, OSError):
                pass
            status = process.exit_status
            signal = process.exit_signal
    finally:
        flusher.cancel()
        await sink.flush()
    if status is not None and status >= 0:
        return status
    if signal:
        return 128 + _signal_number(signal[0])
    return None


def _signal_number(name: str) -> int:
    import signal as signals

    try:
        return int(getattr(signals, f"SIG{name}"))
    except (AttributeError, TypeError):
        return 0
