"""Launch: run the background command on worker-0 and stream every rank's output into the job's log."""

import asyncio
import logging
import shlex
from concurrent.futures import ThreadPoolExecutor

import asyncssh
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.db import connection as db_connection

from .log_store import LogRecord, StoreResult, store_lines
from .models import LogStream
from .mpirun_output import MpirunOutput
from .node_preparation import JobPlan
from .node_ssh import connect
from .ssh_output import STDERR, STDOUT, BoundedOutput

# Batches handed to the writer and not yet stored; a full queue makes the readers wait (backpressure),
# which in turn stops reading the SSH channel, so mpirun and then the program wait too.
PENDING_BATCHES = 2
STORE_RETRY_SECONDS = (0.5, 1, 2, 5, 5, 10, 10, 30, 30, 60)

logger = logging.getLogger(__name__)


def _close_thread_connection() -> None:
    # Looked up in the thread that runs it: each thread has its own database connection.
    db_connection.close()


class LogSink:
    """Stores a job's output in order, in batches, under its log cap, with bounded memory.

    Readers add lines; a full batch, or the periodic tick, hands the batch to one writer that stores
    batches in the order they were handed over, on its own database thread. Once the store reports
    the cap reached, the program's lines are counted and dropped here without touching the database.
    """

    def __init__(self, job_id: int, *, batch_lines: int | None = None, interval: float | None = None):
        self.job_id = job_id
        self.batch_lines = batch_lines or settings.LOG_FLUSH_MAX_LINES
        self.interval = interval or settings.LOG_FLUSH_INTERVAL_SECONDS
        self.batch: list[LogRecord] = []
        self.dropped = 0
        self.capped = False
        self.handing_over = asyncio.Lock()
        self.queue: asyncio.Queue[tuple[list[LogRecord], int]] = asyncio.Queue(maxsize=PENDING_BATCHES)
        self.failure: BaseException | None = None
        self.executor: ThreadPoolExecutor | None = None
        self.tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> "LogSink":
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"log-{self.job_id}")
        self.tasks = [asyncio.create_task(self._write_batches()), asyncio.create_task(self._tick())]
        return self

    async def __aexit__(self, *exc_info) -> None:
        try:
            await self.flush()
        finally:
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self.executor, _close_thread_connection)
            self.executor.shutdown(wait=False)

    async def add(self, record: LogRecord) -> None:
        await self.add_many([record])

    async def add_many(self, records: list[LogRecord]) -> None:
        if self.failure is not None:
            raise self.failure
        if self.capped:
            kept = [record for record in records if record.stream == LogStream.SYSTEM]
            self.dropped += len(records) - len(kept)
            records = kept
        self.batch.extend(records)
        if len(self.batch) >= self.batch_lines:
            await self._hand_over()

    async def flush(self) -> None:
        """Hand over what is buffered and wait until every handed-over batch is stored."""
        await self._hand_over()
        await self.queue.join()
        if self.failure is not None:
            raise self.failure

    async def _hand_over(self) -> None:
        # Taking the batch and queueing it under one lock keeps batches in the order their lines were read.
        async with self.handing_over:
            batch, self.batch = self.batch, []
            dropped, self.dropped = self.dropped, 0
            if (batch or dropped) and self.failure is None:
                await self.queue.put((batch, dropped))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._hand_over()

    async def _write_batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch, dropped = await self.queue.get()
            try:
                result = await self._store(loop, batch, dropped)
                self.capped = self.capped or result.capped
            except Exception as error:  # noqa: BLE001 - the readers must learn of it, not hang on a full queue
                self.failure = error
                self._discard_queued()
            finally:
                self.queue.task_done()

    async def _store(self, loop, batch: list[LogRecord], dropped: int) -> StoreResult:
        # A database that is briefly away (locked, restarting) pauses the output instead of losing it.
        delays = iter(STORE_RETRY_SECONDS)
        while True:
            try:
                return await loop.run_in_executor(self.executor, store_lines, self.job_id, batch, dropped)
            except (OperationalError, InterfaceError) as error:
                delay = next(delays, None)
                if delay is None:
                    raise
                logger.warning("job %s: storing %d log lines failed (%s); retrying in %s s",
                               self.job_id, len(batch), error, delay)
                await loop.run_in_executor(self.executor, _close_thread_connection)
                await asyncio.sleep(delay)

    def _discard_queued(self) -> None:
        while True:
            try:
                self.queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            self.queue.task_done()


async def _pump(output: BoundedOutput, plan: JobPlan, sink: LogSink) -> None:
    """mpirun's stdout and stderr, each read back into its ranks' lines, into the sink until the session ends."""
    streams = {STDOUT: MpirunOutput(LogStream.STDOUT, plan.processes_per_node, settings.LOG_LINE_MAX_BYTES),
               STDERR: MpirunOutput(LogStream.STDERR, plan.processes_per_node, settings.LOG_LINE_MAX_BYTES)}
    # Ends when the channel closes: mpirun exited, or the container went away under us (a stop, a
    # lost node); what was read is kept either way.
    while (chunk := await output.read()) is not None:
        data, datatype = chunk
        await sink.add_many(streams.get(datatype, streams[STDOUT]).feed(data))
    for stream in streams.values():
        await sink.add_many(stream.finish())


async def launch(plan: JobPlan, sink: LogSink) -> int | None:
    """Run mpirun on worker-0; return its exit code, or None when the session was cut before it ended."""
    worker0 = plan.workers[0]
    connection = await connect(plan.container_target(worker0))
    async with sink, connection:
        command = f"cd {shlex.quote(plan.working_dir)} && exec {shlex.join(plan.argv)}"
        channel, output = await connection.create_session(BoundedOutput, command, encoding="utf-8", errors="replace")
        await _pump(output, plan, sink)
        try:
            await asyncio.wait_for(channel.wait_closed(), timeout=10)
        except (asyncio.TimeoutError, asyncssh.Error, OSError):
            pass
        status = channel.get_exit_status()
        signal = channel.get_exit_signal()
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
