"""What runs beside a job's launch: metrics read from its log, the hung-rank watchdog, and auto stop.

Every second or so the monitor looks at the job (a stop first: it is never kept waiting behind a flood of
lines), then takes the log lines stored since its cursor: those the run's log sink told it of as it stored
them (one pass, nothing read back), and from the database only what it was not told of (a run taken up
again, lines another writer stored between two batches, the last lines at the end). Each rank's line moves
that rank's "last heard" time and may hold metric values. A rank silent for longer than the job's
watchdog time (and not recorded as ended by its rank agent: a rank that printed its last line and exited
is not hung) marks the job suspected hung (the job page and the API list the silent ranks); when the job's user
chose so (or, choosing nothing, with the administrator's leave) the monitor then asks the run to stop the
job, as it does when the job reaches its auto stop limit.
"""

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict, cast

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from jobs.launch.plan import worker_of_rank
from jobs.logs.store import StoredLogLine, lines_after, service_line
from jobs.models import JobEvent, JobStatus, LauncherDefaults, LogStream, MetricPoint, StopReason, TrainingJob
from jobs.results.evidence import REASON_WATCHDOG
from jobs.results.metrics import MetricExtractor, default_metric_definitions
from jobs.results.watchdog import watchdog_limit, watchdog_stops
from jobs.runtime.evidence import queue_evidence

logger = logging.getLogger(__name__)

MONITOR_INTERVAL_SECONDS = 1.0
# Up to 100,000 lines a tick: above what the log stores a second (about 61,000 here), so the monitor keeps
# up with a flood and the run's end does not wait for it to catch up.
READ_BATCH = 4000
BATCHES_PER_TICK = 25


class SilentRank(TypedDict):
    """A rank the watchdog found silent (kept in TrainingJob.silent_ranks)."""

    rank: int
    worker: int
    node: str
    silent_since: str
    last_line: str
    # The silence it was measured against (a default may change before the job's page is read).
    limit_seconds: int


class WatchedJob(TypedDict):
    status: str
    started_at: datetime | None
    auto_stop_hours: int | None
    watchdog_seconds: int | None  # the user's choice; None: the administrator's default
    watchdog_action: str | None  # the same: "warn" or "stop"
    log_lines_dropped: int


@dataclass(frozen=True)
class StopRequest:
    reason: str
    message: str


StopCallback = Callable[[str, str], Coroutine[Any, Any, None]]
# A rank that printed a Python traceback's last line (rank, that line, when) and nothing since.
RaisedCallback = Callable[[int, str, datetime], Coroutine[Any, Any, None]]
TRACEBACK_START = "Traceback (most recent call last):"


class RunMonitor:
    def __init__(self, job_id: int, rank_workers: Sequence[int], node_names: dict[int, str],
                 request_stop: StopCallback, started: datetime | None = None,
                 not_running: asyncio.Event | None = None, on_raised: RaisedCallback | None = None):
        self.job_id = job_id
        self.on_raised = on_raised
        # Ranks inside a traceback they print, then those that printed its last line and nothing since (rank:
        # that line, when); new ones wait in `raised_news` for the event loop (a deque, as `fed` is).
        self.in_traceback: set[int] = set()
        self.raised: dict[int, tuple[str, datetime]] = {}
        self.raised_news: deque[tuple[int, str, datetime]] = deque()
        self.rank_workers = rank_workers
        self.node_names = node_names
        self.request_stop = request_stop
        # Set once the job is seen out of Running (a stop from anywhere), for the launch to wind up.
        self.not_running = not_running
        self.status: str = JobStatus.RUNNING
        started = started or timezone.now()
        # A rank that has printed nothing yet has been silent since the launch.
        self.last_heard = {rank: started for rank in range(len(rank_workers))}
        self.last_text: dict[int, str] = {}
        self.cursor = 0
        # Batches of lines the log sink stored, in order (appended in the run's event loop, taken in the
        # database thread: a deque's append and popleft need no lock).
        self.fed: deque[Sequence[StoredLogLine]] = deque()
        self.extractor: MetricExtractor | None = None
        self.silent: list[int] = []
        # Ranks whose rank agent recorded their end (the worker watch, through the run): they print no more and
        # are never silent. Replaced whole in the event loop, read in the database thread.
        self.ended: frozenset[int] = frozenset()
        self.stop_task: asyncio.Task[None] | None = None
        # The watchdog warned: the ranks' evidence is asked for once, off the database thread.
        self.evidence_wanted = False

    async def run(self) -> None:
        while True:
            try:
                request = await sync_to_async(self.tick)()
            except Exception:  # a monitor hiccup must not end the job; the next tick retries
                logger.exception("job %s: monitor tick failed", self.job_id)
                request = None
            if self.not_running is not None and self.status != JobStatus.RUNNING:
                self.not_running.set()
            while self.raised_news and self.on_raised is not None:
                try:
                    await self.on_raised(*self.raised_news.popleft())
                except Exception:  # the database briefly away: the monitor (and the stops it carries out) goes on
                    logger.exception("job %s: recording a rank that raised failed", self.job_id)
            if self.evidence_wanted:
                self.evidence_wanted = False
                await asyncio.to_thread(queue_evidence, self.job_id, REASON_WATCHDOG)
            if request and self.stop_task is None:
                # Its own task: the teardown it starts must not be cut short when the monitor is cancelled.
                self.stop_task = asyncio.create_task(self.request_stop(request.reason, request.message))
            await asyncio.sleep(MONITOR_INTERVAL_SECONDS)

    async def finish(self, task: asyncio.Task[None]) -> None:
        """Stop the loop, let a stop it began complete, and read the lines the launch stored last."""
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        if self.stop_task is not None:
            try:
                await self.stop_task
            except Exception:  # the run's own teardown follows anyway
                logger.exception("job %s: stop by the console failed", self.job_id)
        await sync_to_async(self.read_new_lines)(None)

    def take_stored(self, lines: Sequence[StoredLogLine]) -> None:
        """What the log sink stored (LogSink.on_stored): read at the next tick, without a read-back."""
        self.fed.append(lines)

    # The work of one tick, in the database thread.

    def tick(self) -> StopRequest | None:
        # The job first: a stop is seen within a tick, whatever the log holds (its lines are read at the end).
        job = cast(WatchedJob, TrainingJob.objects.filter(pk=self.job_id).values(*WatchedJob.__annotations__).get())
        self.status = job["status"]
        if job["status"] != JobStatus.RUNNING:
            return None
        self.read_new_lines()
        now = timezone.now()
        hours = job["auto_stop_hours"]
        if hours and job["started_at"] and now - job["started_at"] >= timedelta(hours=hours):
            return StopRequest(StopReason.AUTO_STOP, f"Stopped by auto stop: the job reached its limit of {hours} h")
        return self.watch(job, now)

    def read_new_lines(self, max_batches: int | None = BATCHES_PER_TICK) -> None:
        """Take what was stored since the cursor: what the sink told of, and from the database what it did
        not (a few batches a tick, so the run's other database work is not held up; all at the end)."""
        if self.extractor is None:
            definitions, starts = TrainingJob.objects.values_list("metric_definitions", "attempt_log_starts").get(
                pk=self.job_id)
            self.extractor = MetricExtractor(definitions or default_metric_definitions())
            # A run taken up again reads on after the points stored already, and an attempt after a
            # restart from its own first line: no point is stored twice.
            stored = MetricPoint.objects.filter(job_id=self.job_id).aggregate(last=Max("seq"))["last"] or 0
            self.cursor = max(self.cursor, starts[-1] if starts else 0, stored)
        points: list[MetricPoint] = []
        told = False
        while self.fed:
            told = True
            fresh = [line for line in self.fed.popleft() if line.seq > self.cursor]
            if not fresh:
                continue
            if fresh[0].seq > self.cursor + 1:  # lines stored beside the sink's: read back just those
                self._read_back(points, through=fresh[0].seq - 1, max_batches=None)
            self._take(points, fresh)
        if not told or max_batches is None:
            self._read_back(points, through=None, max_batches=max_batches)
        if points:
            self._store_points(points)

    def _read_back(self, points: list[MetricPoint], through: int | None, max_batches: int | None) -> None:
        batches = 0
        while max_batches is None or batches < max_batches:
            batches += 1
            lines = lines_after(self.job_id, self.cursor, READ_BATCH)
            wanted = [line for line in lines if through is None or line.seq <= through]
            self._take(points, wanted)
            if len(lines) < READ_BATCH or len(wanted) < len(lines):
                return

    def _take(self, points: list[MetricPoint], lines: Sequence[StoredLogLine]) -> None:
        assert self.extractor is not None
        if not lines:
            return
        self.cursor = lines[-1].seq
        ranks: list[StoredLogLine] = []
        for line in lines:
            rank = line.rank
            if rank is None or line.stream == LogStream.SYSTEM:
                continue
            ranks.append(line)
            self._follow_traceback(rank, line)
            if line.at > self.last_heard.get(rank, line.at - timedelta(seconds=1)):
                self.last_heard[rank] = line.at
            self.last_text[rank] = line.text[:300]
        # The whole batch at once: most lines hold no metric, and are ruled out without a search each.
        for index, found in self.extractor.extract_many([line.text for line in ranks]):
            line = ranks[index]
            points.extend(MetricPoint(job_id=self.job_id, name=point.name, rank=line.rank, step=point.step,
                                      value=point.value, at=line.at, seq=line.seq) for point in found)

    def _follow_traceback(self, rank: int, line: StoredLogLine) -> None:
        """A Python traceback in a rank's stderr: its last line (the exception) marks the rank as having raised,
        until it prints anything else (a program that caught it and went on)."""
        self.raised.pop(rank, None)
        if line.stream != LogStream.STDERR:
            return
        if line.text.startswith(TRACEBACK_START):
            self.in_traceback.add(rank)
        elif rank in self.in_traceback and line.text[:1] not in (" ", "\t", ""):
            self.in_traceback.discard(rank)
            self.raised[rank] = (line.text[:300], line.at)
            self.raised_news.append((rank, line.text[:300], line.at))

    def last_line_at(self) -> datetime:
        """When any rank last printed (the launch, before any did)."""
        return max(self.last_heard.values(), default=timezone.now())

    def take_ended(self, ranks: Iterable[int]) -> None:
        """Ranks found ended, as 0 or not: the watchdog no longer counts them (see JobRun.ranks_recorded_ended)."""
        self.ended = self.ended | frozenset(ranks)

    def still_raised(self, rank: int) -> bool:
        """Whether the rank printed nothing since the traceback it was last seen to raise."""
        return rank in self.raised

    def _store_points(self, points: list[MetricPoint]) -> None:
        with transaction.atomic():
            MetricPoint.objects.bulk_create(points)
            job = TrainingJob.objects.select_for_update().only("final_metrics").get(pk=self.job_id)
            final = dict(job.final_metrics)
            # Rank 0's value, as the pages' headline shows it (a metric no rank tags counts as rank 0's).
            for point in points:
                if point.rank in (0, None):
                    final[point.name] = point.value
            TrainingJob.objects.filter(pk=self.job_id).update(final_metrics=final)

    def watch(self, job: WatchedJob, now: datetime) -> StopRequest | None:
        defaults = LauncherDefaults.current()
        seconds = watchdog_limit(job["watchdog_seconds"], defaults)
        # Past the log cap the output is no longer stored, so silence can no longer be told from it.
        if not seconds or job["log_lines_dropped"]:
            return None
        ended = self.ended
        silent = sorted(rank for rank, heard in self.last_heard.items()
                        if rank not in ended and (now - heard).total_seconds() > seconds)
        stops = watchdog_stops(job["watchdog_action"], defaults)
        if silent != self.silent:
            self._record_silence(silent, seconds, now, ended)
            if silent and not self.silent and not stops:
                # A warning only: the ranks' stacks are taken while they hang (a stop waits for them itself). Asked
                # from the event loop: a broker that stalls must not hold this thread, the run's heartbeat's too.
                self.evidence_wanted = True
        self.silent = silent
        if silent and stops:
            ranks = ", ".join(str(rank) for rank in silent)
            return StopRequest(StopReason.WATCHDOG,
                               f"Stopped by the watchdog: rank(s) {ranks} printed nothing for more than {seconds} s")
        return None

    def _record_silence(self, silent: list[int], seconds: int, now: datetime, ended: frozenset[int]) -> None:
        entries = [
            SilentRank(
                rank=rank,
                worker=worker_of_rank(self.rank_workers, rank),
                node=self.node_names.get(worker_of_rank(self.rank_workers, rank), ""),
                silent_since=self.last_heard[rank].isoformat(),
                # What it printed last (a traceback's last line, a stuck step) often says why it stopped.
                last_line=self.last_text.get(rank, ""),
                limit_seconds=seconds,
            )
            for rank in silent
        ]
        ranks = ", ".join(str(rank) for rank in silent)
        with transaction.atomic():
            if silent:
                fields: dict[str, object] = {"silent_ranks": entries}
                if not self.silent:
                    fields["suspected_hung_since"] = now
                TrainingJob.objects.filter(pk=self.job_id).update(**fields)
                message = f"Suspected hung: rank(s) {ranks} printed nothing for more than {seconds} s"
            else:
                TrainingJob.objects.filter(pk=self.job_id).update(suspected_hung_since=None, silent_ranks=[])
                gone = ", ".join(str(rank) for rank in self.silent if rank in ended)
                message = (f"No longer suspected hung: rank(s) {gone} ended" if gone
                           else "No longer suspected hung: every rank printed again")
            JobEvent.objects.create(job_id=self.job_id, kind="watchdog", message=message)
        service_line(self.job_id, message)
