"""A job's log: lines appended in batches with a gapless sequence, read back by cursor."""

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .models import LogLine, LogStream, TrainingJob
from .progress import JobProgressPublisher

SERVICE_LOG_PREFIX = "[ModelArts Service Log]"


@dataclass
class LogRecord:
    text: str
    stream: str = LogStream.STDOUT
    rank: int | None = None
    worker_index: int | None = None
    at: datetime = field(default_factory=timezone.now)


def _clip(text: str) -> str:
    limit = settings.LOG_LINE_MAX_BYTES
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= limit:
        return text
    return encoded[:limit].decode("utf-8", "ignore") + " …[line cut]"


def append_log_lines(job_id: int, records: list[LogRecord]) -> int:
    """Store records after the job's last line; returns the new last sequence number.

    The job row is locked while numbering, so writers in several processes (the launcher, a stop
    request) interleave whole batches and never reuse a number.
    """
    if not records:
        return TrainingJob.objects.filter(pk=job_id).values_list("log_line_count", flat=True).get()
    with transaction.atomic():
        start = TrainingJob.objects.select_for_update().filter(pk=job_id).values_list("log_line_count", flat=True).get()
        LogLine.objects.bulk_create(
            LogLine(
                job_id=job_id,
                seq=start + offset,
                worker_index=record.worker_index,
                rank=record.rank,
                stream=record.stream,
                text=_clip(record.text),
                at=record.at,
            )
            for offset, record in enumerate(records, start=1)
        )
        last = start + len(records)
        TrainingJob.objects.filter(pk=job_id).update(log_line_count=last)
    transaction.on_commit(lambda: JobProgressPublisher(job_id).log_appended(last))
    return last


def service_line(job_id: int, text: str, worker_index: int | None = None) -> int:
    return append_log_lines(job_id, [LogRecord(text=text, stream=LogStream.SYSTEM, worker_index=worker_index)])


def lines_after(job_id: int, after_seq: int, limit: int = 1000):
    return LogLine.objects.filter(job_id=job_id, seq__gt=after_seq).order_by("seq")[:limit]


def render_line(line: LogLine) -> str:
    """A line as the per-worker log files show it: the platform's lines marked, ranks tagged."""
    if line.stream == LogStream.SYSTEM:
        return f"{SERVICE_LOG_PREFIX}{line.text}"
    if line.rank is not None:
        return f"[rank {line.rank}] {line.text}"
    return line.text


def line_matches(line: LogLine, query: dict) -> bool:
    if query.get("worker") is not None and line.worker_index != query["worker"]:
        return False
    if query.get("rank") is not None and line.rank != query["rank"]:
        return False
    if query.get("stream") and line.stream != query["stream"]:
        return False
    if not query.get("system", True) and line.stream == LogStream.SYSTEM:
        return False
    if query.get("q") and query["q"].lower() not in line.text.lower():
        return False
    return True
