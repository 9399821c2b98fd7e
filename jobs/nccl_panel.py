"""The NCCL panel's content: the parser's summary of a job's log and the diagnosis against the job's spec.

Only the lines the parser can use are read from the database (the SQL keeps lines that mention NCCL,
nccl-tests' rank lines, and the few lines after an error it reads as context), so a job that printed
a gigabyte costs one pass over its log, not one per look. While the job runs, each look reads only the
lines stored since the last one; once it is over, the answer is kept in the cache.
"""

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from django.core.cache import cache
from django.db.models import Q

from .models import FINAL_STATES, LogLine, LogStream, TrainingJob
from .nccl_diagnosis import diagnose
from .nccl_parser import parse_nccl_log
from .nccl_patterns import ERROR_TEXT

# The parser's own test for a line worth reading (jobs.nccl_parser): it mentions nccl in any case,
# or it is an nccl-tests "# Rank n Pid p on host device d" line.
NCCL_LINES = Q(text__icontains="nccl") | (Q(text__contains="Rank") & Q(text__contains="Pid"))
# After an error line the parser reads a few more lines as its detail ("Last error:" and the cause).
CONTEXT_LINES_AFTER_ERROR = 4
# Enough for the NCCL lines of thousands of ranks; a log with more is summarised from its first ones.
MAX_NCCL_LINES = 50_000
MAX_FOLLOWED_JOBS = 32
CACHE_SECONDS = 24 * 3600


@dataclass
class _LogScan:
    """The NCCL lines of one job read so far, as mpirun printed them, in order."""

    through: int = 0
    lines: dict[int, str] = field(default_factory=dict)
    context_wanted: set[int] = field(default_factory=set)
    truncated: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read_on(self, job_id: int, total: int) -> None:
        if total <= self.through:
            return
        if self.truncated:
            self.through = total
            return
        rows = LogLine.objects.filter(job_id=job_id, seq__gt=self.through, seq__lte=total)
        wanted_now = {seq for seq in self.context_wanted if seq <= total}
        found = rows.filter(NCCL_LINES | Q(seq__in=wanted_now)).order_by("seq")
        for seq, stream, rank, text in found.values_list("seq", "stream", "rank", "text").iterator(chunk_size=2000):
            if len(self.lines) >= MAX_NCCL_LINES:
                self.truncated = True
                break
            self.lines[seq] = as_printed(stream, rank, text)
            if ERROR_TEXT.search(text):
                self.context_wanted.update(range(seq + 1, seq + 1 + CONTEXT_LINES_AFTER_ERROR))
        missing = sorted(seq for seq in self.context_wanted if seq <= total and seq not in self.lines)
        if missing and not self.truncated:
            # Context lines of an error line found above (their numbers were not known before the read).
            for seq, stream, rank, text in rows.filter(seq__in=missing).values_list("seq", "stream", "rank", "text"):
                self.lines[seq] = as_printed(stream, rank, text)
        self.context_wanted = {seq for seq in self.context_wanted if seq > total}
        self.through = total

    def ordered_lines(self) -> list[str]:
        return [self.lines[seq] for seq in sorted(self.lines)]


def as_printed(stream: str, rank: int | None, text: str) -> str:
    """Give a rank's line its mpirun tag back, so the parser can tell which launcher rank warned."""
    if rank is None or stream == LogStream.SYSTEM:
        return text
    return f"[1,{rank}]<{stream}>:{text}"


# Scans of running jobs in this process, keyed by id and creation time (a recreated database reuses ids).
_scans: "OrderedDict[tuple, _LogScan]" = OrderedDict()
_scans_lock = threading.Lock()


def _scan_key(job: TrainingJob) -> tuple:
    return (job.pk, job.created_at)


def _scan_for(job: TrainingJob) -> _LogScan:
    with _scans_lock:
        scan = _scans.pop(_scan_key(job), None)
        if scan is None or scan.through > job.log_line_count:
            scan = _LogScan()
        _scans[_scan_key(job)] = scan
        while len(_scans) > MAX_FOLLOWED_JOBS:
            _scans.popitem(last=False)
        return scan


def _forget_scan(job: TrainingJob) -> None:
    with _scans_lock:
        _scans.pop(_scan_key(job), None)


def nccl_report(job: TrainingJob) -> dict:
    """What the panel shows: the summary, the diagnosis in plain words, and how much of the log it reflects."""
    final = job.status in FINAL_STATES
    cache_key = f"nccl-report:{job.pk}:{job.created_at.timestamp()}:{job.log_line_count}"
    if final:
        cached = cache.get(cache_key)
        if cached is not None:
            return cached
    scan = _scan_for(job)
    with scan.lock:
        scan.read_on(job.pk, job.log_line_count)
        lines, truncated = scan.ordered_lines(), scan.truncated
    summary = parse_nccl_log(lines)
    # A job can fail before NCCL logs a line of its own (a traceback that only quotes NCCL's error).
    seen = summary.nccl_line_count > 0 or bool(summary.errors) or summary.version is not None
    expected_ranks = job.node_count * job.spec.processes_per_node
    findings = diagnose(summary, promised_network=job.spec.network, node_count=job.node_count,
                        expected_ranks=expected_ranks) if seen else []
    report = {
        "status": job.status,
        "final": final,
        "seen": seen,
        "log_lines": job.log_line_count,
        "nccl_lines": len(lines),
        "truncated": truncated,
        "expected": {"network": job.spec.network, "nodes": job.node_count, "ranks": expected_ranks,
                     "workers": [f"{job.dns_name}-worker-{index}" for index in range(job.node_count)]},
        "summary": summary.to_dict(),
        "diagnosis": [finding.to_dict() for finding in findings],
    }
    if final:
        cache.set(cache_key, report, CACHE_SECONDS)
        _forget_scan(job)
    return report
