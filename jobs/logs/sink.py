"""The sink a running job's output goes into: in order, in batches, under the log cap, with bounded memory."""

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.db import connection as db_connection

from jobs.logs.store import LogRecord, StoredLogLine, StoreResult, store_lines
from jobs.models import LogStream

# Batches handed to the writer and not yet stored; a full queue makes the readers wait (backpressure),
# which in turn stops reading the SSH channel, so mpirun and then the program wait too.
PENDING_BATCHES = 2
# A batch is handed over at LOG_FLUSH_MAX_LINES lines or at this much text, whichever comes first: what a
# batch costs beside its rows (the job's row locked and updated, the commit, the news on Redis, the hop to
# the writer's thread) is spread over many short lines, and long lines do not hold more memory for it.
BATCH_MAX_CHARS = 4 << 20
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

    def __init__(self, job_id: int, *, batch_lines: int | None = None, interval: float | None = None,
                 owner: str = "", on_stored: Callable[[Sequence[StoredLogLine]], None] | None = None):
        self.job_id = job_id
        # Told each batch's lines once they are stored (the run's monitor), so that nobody reads them back.
        self.on_stored = on_stored
        # The run's owner (TrainingJob.run_owner): lines with a cursor are stored only while it owns the run.
        self.owner = owner
        self.batch_lines = batch_lines or settings.LOG_FLUSH_MAX_LINES
        self.interval = interval or settings.LOG_FLUSH_INTERVAL_SECONDS
        self.batch: list[LogRecord] = []
        self.batch_chars = 0
        self.dropped = 0
        self.capped = False
        self.handing_over = asyncio.Lock()
        self.queue: asyncio.Queue[tuple[list[LogRecord], int, dict | None]] = asyncio.Queue(maxsize=PENDING_BATCHES)
        # Where the reader stands after the lines added last (see add_many); stored with their batch.
        self.mark: dict | None = None
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
            if self.executor is not None:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self.executor, _close_thread_connection)
                self.executor.shutdown(wait=False)

    async def add(self, record: LogRecord) -> None:
        await self.add_many([record])

    async def add_many(self, records: list[LogRecord], mark: dict | None = None) -> None:
        """Add lines; `mark` says where their reader stands once they are read, and is stored in the same
        transaction as they are (TrainingJob.launch_cursor), so a reader that resumes from it neither
        misses nor repeats a line."""
        if self.failure is not None:
            raise self.failure
        if self.capped:
            kept = [record for record in records if record.stream == LogStream.SYSTEM]
            self.dropped += len(records) - len(kept)
            records = kept
        self.batch.extend(records)
        self.batch_chars += sum(len(record.text) for record in records)
        if mark is not None:
            self.mark = mark
        if len(self.batch) >= self.batch_lines or self.batch_chars >= BATCH_MAX_CHARS:
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
            batch, self.batch, self.batch_chars = self.batch, [], 0
            dropped, self.dropped = self.dropped, 0
            mark, self.mark = self.mark, None
            if (batch or dropped or mark is not None) and self.failure is None:
                await self.queue.put((batch, dropped, mark))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._hand_over()

    async def _write_batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch, dropped, mark = await self.queue.get()
            try:
                result = await self._store(loop, batch, dropped, mark)
                self.capped = self.capped or result.capped
                if self.on_stored is not None and result.lines:
                    self.on_stored(result.lines)
            except Exception as error:  # noqa: BLE001 - the readers must learn of it, not hang on a full queue
                self.failure = error
                self._discard_queued()
            finally:
                self.queue.task_done()

    async def _store(self, loop: asyncio.AbstractEventLoop, batch: list[LogRecord], dropped: int,
                     mark: dict | None) -> StoreResult:
        # A database that is briefly away (locked, restarting) pauses the output instead of losing it.
        delays = iter(STORE_RETRY_SECONDS)
        while True:
            try:
                return await loop.run_in_executor(self.executor, store_lines, self.job_id, batch, dropped, mark,
                                                  self.owner if mark is not None else "")
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
