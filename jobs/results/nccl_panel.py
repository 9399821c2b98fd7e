"""The NCCL panel's content: the parser's summary of a job's log and the diagnosis against the job's spec.

Only the lines the parser can use are read from the database (the SQL keeps lines that mention NCCL,
nccl-tests' rank lines, and the few lines after an error it reads as context), and they go to the
parser as the records they are (rank, stream, text), not rebuilt into mpirun's printed form. Each
followed job keeps one reader (nccl.NcclLogReader) in this process: while the job runs, each look
feeds it only the lines stored since the last look and takes its summary, so a job that printed a
gigabyte costs one pass over its log, not one per look. Once the job is over, the answer is kept in
the cache and the reader let go.
"""

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TypedDict

from django.core.cache import cache
from django.db.models import Q

from nccl import NcclLogReader, diagnose
from nccl.patterns import ERROR_TEXT

from ..models import FINAL_STATES, LogLine, TrainingJob

# The parser's own test for a line worth reading (nccl.parser): it mentions nccl in any case,
# or it is an nccl-tests "# Rank n Pid p on host device d" line.
NCCL_LINES = Q(text__icontains="nccl") | (Q(text__contains="Rank") & Q(text__contains="Pid"))
# After an error line the parser reads a few more lines as its detail ("Last error:" and the cause).
CONTEXT_LINES_AFTER_ERROR = 4
# Enough for the NCCL lines of thousands of ranks; a log with more is summarised from its first ones.
MAX_NCCL_LINES = 50_000
MAX_FOLLOWED_JOBS = 32
CACHE_SECONDS = 24 * 3600


class ExpectedRun(TypedDict):
    """What the job's spec promises, for the panel to compare with what NCCL did."""

    network: str
    nodes: int
    ranks: int
    workers: list[str]


class NcclReport(TypedDict):
    """What `nccl_report` returns and the API serves as JSON."""

    status: str
    final: bool
    seen: bool  # NCCL printed something, or the program quoted one of its errors
    log_lines: int  # lines the job has stored
    nccl_lines: int  # of them, the lines given to the parser
    truncated: bool  # more than MAX_NCCL_LINES: the summary is of the first ones
    expected: ExpectedRun
    summary: dict  # nccl.NcclSummary.to_dict()
    diagnosis: list[dict]  # nccl.Finding.to_dict() of each finding, errors first


@dataclass
class _LogScan:
    """The NCCL lines of one job read so far, fed in order to one reader."""

    through: int = 0
    reader: NcclLogReader = field(default_factory=NcclLogReader)
    lines_fed: int = 0
    context_wanted: set[int] = field(default_factory=set)
    truncated: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read_on(self, job_id: int, total: int) -> None:
        """Feed the reader the lines it wants among those stored after `through`, up to `total`."""
        if total <= self.through:
            return
        if self.truncated:
            self.through = total
            return
        rows = LogLine.objects.filter(job_id=job_id, seq__gt=self.through, seq__lte=total)
        context_wanted, truncated = set(self.context_wanted), False
        wanted_now = {seq for seq in context_wanted if seq <= total}
        found = rows.filter(NCCL_LINES | Q(seq__in=wanted_now)).order_by("seq")
        # This look's records by seq; fed once all are read, so a failed query feeds nothing twice.
        batch: dict[int, tuple[int | None, str, str]] = {}
        for seq, stream, rank, text in found.values_list("seq", "stream", "rank", "text").iterator(chunk_size=2000):
            if self.lines_fed + len(batch) >= MAX_NCCL_LINES:
                truncated = True
                break
            batch[seq] = (rank, stream, text)
            if ERROR_TEXT.search(text):
                context_wanted.update(range(seq + 1, seq + 1 + CONTEXT_LINES_AFTER_ERROR))
        missing = sorted(seq for seq in context_wanted if seq <= total and seq not in batch)
        if missing and not truncated:
            # Context lines of an error line found above (their numbers were not known before the read).
            for seq, stream, rank, text in rows.filter(seq__in=missing).values_list("seq", "stream", "rank", "text"):
                batch[seq] = (rank, stream, text)
        feed_record = self.reader.feed_record
        for seq in sorted(batch):
            feed_record(*batch[seq])
        self.lines_fed += len(batch)
        self.context_wanted = {seq for seq in context_wanted if seq > total}
        self.truncated = truncated
        self.through = total


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


def nccl_report(job: TrainingJob) -> NcclReport:
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
        # The summary shares nothing with the reader, so it can be used after the lock is let go.
        summary, nccl_lines, truncated = scan.reader.summary(), scan.lines_fed, scan.truncated
    # A job can fail before NCCL logs a line of its own (a traceback that only quotes NCCL's error).
    seen = summary.nccl_line_count > 0 or bool(summary.errors) or summary.version is not None
    expected_ranks = job.node_count * job.spec.processes_per_node
    findings = diagnose(summary, promised_network=job.spec.network, node_count=job.node_count,
                        expected_ranks=expected_ranks) if seen else []
    report: NcclReport = {
        "status": job.status,
        "final": final,
        "seen": seen,
        "log_lines": job.log_line_count,
        "nccl_lines": nccl_lines,
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
