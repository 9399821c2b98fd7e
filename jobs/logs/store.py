"""A job's log: lines appended in batches with a gapless sequence, read back by cursor with the filters in SQL.

Sequence numbers run 1, 2, 3, ... per job with no gaps (a line kept out by the log cap gets none), so a
range of numbers is also a bound on the rows a read looks at: a filtered read scans at most a window of
the log and says where it stopped, and a reader that resumes from there neither misses nor repeats a line.
"""

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast
from django.template.defaultfilters import filesizeformat
from django.utils import timezone

from jobs.logs.matching import ERROR_CANDIDATES, line_filter, line_match, looks_like_error
from jobs.logs.progress import JobProgressPublisher
from jobs.models import LauncherDefaults, LogLine, LogStream, TrainingJob

SERVICE_LOG_PREFIX = "[ModelArts Service Log]"
# mpirun's own lines (not a rank's): what it says of a launch, a failure, an abort.
MPIRUN_LINE_PREFIX = "[mpirun] "
# How many sequence numbers one filtered read may look at; a sparse filter answers in steps of this.
SCAN_WINDOW = 20000
DOWNLOAD_CHUNK_LINES = 5000
# The parameters one INSERT of log lines carries where the database sets no lower limit (PostgreSQL's is 65,535).
INSERT_MAX_PARAMS = 7000
ERROR_CANDIDATE_CHUNK = 500


@dataclass
class LogRecord:
    text: str
    stream: str = LogStream.STDOUT
    rank: int | None = None
    worker_index: int | None = None
    at: datetime = field(default_factory=timezone.now)


class StoredLogLine(NamedTuple):
    """A stored line as its readers use it: read as plain values, not as a model (which costs a log
    reader twice the time per line; a live follower or the run's monitor reads every line)."""

    seq: int
    worker_index: int | None
    rank: int | None
    stream: str
    text: str
    at: datetime


STORED_LINE_FIELDS = StoredLogLine._fields


def _stored(lines: QuerySet[LogLine]) -> list[StoredLogLine]:
    if connection.vendor != "sqlite":
        return list(map(StoredLogLine._make, lines.values_list(*STORED_LINE_FIELDS)))
    # SQLite keeps a time as text, which its driver and then Django parse on every row: a third of a live
    # follower's time a line. The lines of one read came in together and share a handful of times, so the
    # text is read as it is and each distinct time parsed once, by Django's own converter.
    # Imported here: the SQLite backend is loaded by now, and importing it on PostgreSQL would be circular.
    from django.db.backends.sqlite3.operations import DatabaseOperations as SQLiteOperations

    operations = connection.ops
    assert isinstance(operations, SQLiteOperations)
    times: dict[str, datetime] = {}

    def parsed(text: str) -> datetime:
        value = operations.convert_datetimefield_value(text, None, connection)
        assert isinstance(value, datetime), "a line's time is never NULL"
        times[text] = value
        return value

    rows = lines.values_list(*STORED_LINE_FIELDS[:-1], Cast("at", TextField()))
    return [StoredLogLine(seq, worker_index, rank, stream, text, times[at] if at in times else parsed(at))
            for seq, worker_index, rank, stream, text, at in rows]


@dataclass(frozen=True)
class StoreResult:
    last_seq: int
    # The job's log cap has been reached: its program's further output is not stored.
    capped: bool
    # The lines as stored, with their sequence numbers: what the run's monitor reads, without a read-back.
    lines: tuple[StoredLogLine, ...] = ()


def _clip(text: str, limit: int) -> tuple[str, int]:
    """The text as stored, and its size in bytes (no longer than `limit`, LOG_LINE_MAX_BYTES)."""
    # PostgreSQL's text holds no NUL; a program that prints one must not stop its job's log.
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if text.isascii():  # most lines: their size is their length, no encoding needed
        if len(text) <= limit:
            return text, len(text)
        encoded = text.encode("ascii")
    else:
        encoded = text.encode("utf-8", "replace")
        if len(encoded) <= limit:
            return text, len(encoded)
    clipped = encoded[:limit].decode("utf-8", "ignore") + " …[line cut]"
    return clipped, len(clipped.encode("utf-8"))


def readable_size(count: int) -> str:
    """Django's filesizeformat with a plain space: these words go into logs and messages, not only pages."""
    return filesizeformat(count).replace("\xa0", " ")


def cap_note(cap: int) -> str:
    return (f"Log cap reached: {readable_size(cap)} of output stored. The program's further output is not stored; "
            "the job keeps running.")


class RunTakenOver(Exception):
    """The run's lines come from a process that is no longer its owner: another one follows it now."""


def store_lines(job_id: int, records: list[LogRecord], dropped_before: int = 0,
                launch_cursor: dict | None = None, owner: str = "") -> StoreResult:
    """Store records after the job's last line, under its log cap.

    The job row is locked while numbering, so writers in several processes (the launcher, a stop
    request) interleave whole batches and never reuse a number. The platform's own lines are always
    stored; the program's output stops at the cap, where one system line says so. `dropped_before`
    counts output lines a writer already kept out on its own after learning the cap was reached.
    `launch_cursor`, when given, is where the reader of the run's output stands after these records,
    kept in the same transaction; with `owner`, only while that process still owns the run (RunTakenOver
    otherwise), so a process that was thought gone cannot store lines its successor reads again.
    """
    with transaction.atomic():
        job = (TrainingJob.objects.select_for_update().filter(pk=job_id)
               .values("log_line_count", "log_bytes", "log_cap_bytes", "log_lines_dropped", "run_owner").get())
        if owner and job["run_owner"] != owner:
            raise RunTakenOver(f"job {job_id} is followed by {job['run_owner'] or 'nobody'} now")
        cap = job["log_cap_bytes"]
        if cap is None:
            cap = LauncherDefaults.current().log_cap_bytes
        used, dropped = job["log_bytes"], job["log_lines_dropped"] + dropped_before
        start = job["log_line_count"]
        seq = start
        lines: list[StoredLogLine] = []
        limit, system = settings.LOG_LINE_MAX_BYTES, LogStream.SYSTEM
        for record in records:
            text = record.text
            # Most lines are short ASCII without a NUL: stored as they are, their size their length.
            if len(text) <= limit and text.isascii() and "\x00" not in text:
                size = len(text)
            else:
                text, size = _clip(text, limit)
            if record.stream != system:
                if dropped or (cap and used + size + 1 > cap):
                    if not dropped:
                        seq += 1
                        lines.append(StoredLogLine(seq, None, None, system, cap_note(cap), record.at))
                    dropped += 1
                    continue
                used += size + 1
            seq += 1
            lines.append(StoredLogLine(seq, record.worker_index, record.rank, record.stream, text, record.at))
        _insert_lines(job_id, lines)
        last = seq
        fields: dict[str, object] = {"log_line_count": last, "log_bytes": used, "log_lines_dropped": dropped,
                                     "log_cap_bytes": cap}
        if launch_cursor is not None:
            fields["launch_cursor"] = launch_cursor
        TrainingJob.objects.filter(pk=job_id).update(**fields)
    if lines:
        transaction.on_commit(lambda: JobProgressPublisher(job_id).log_appended(last))
    return StoreResult(last_seq=last, capped=dropped > 0, lines=tuple(lines))


_INSERT_COLUMNS = ("job", "seq", "worker_index", "rank", "stream", "text", "at")


def _column_of(field: object) -> str:
    column = getattr(field, "column", None)
    assert isinstance(column, str), f"{field} is a concrete field with a column"
    return column


def _insert_lines(job_id: int, lines: list[StoredLogLine]) -> None:
    """The lines in a few multi-row INSERTs, as many rows each as the database takes parameters for.

    bulk_create spends most of its time preparing each value through the field machinery (about ten
    times the database's own work for short lines); log lines are plain values, so they go straight in.
    Not one INSERT a row (executemany): SQLite's driver lets go of the GIL for each statement it steps,
    and taking it back waits for whatever else the process runs (the run's event loop reading the next
    lines), so a batch stored row by row waited out hundreds of thread switches.
    """
    if not lines:
        return
    meta, quote = LogLine._meta, connection.ops.quote_name
    columns = ", ".join(quote(_column_of(meta.get_field(name))) for name in _INSERT_COLUMNS)
    width = len(_INSERT_COLUMNS)
    per_statement = (connection.features.max_query_params or INSERT_MAX_PARAMS) // width
    # The lines of one read share their time: each distinct time is converted once, not once a line.
    adapted: dict[datetime, Any] = {}
    adapt_time = connection.ops.adapt_datetimefield_value
    values: list[Any] = []
    for seq, worker_index, rank, stream, text, at in lines:
        values += (job_id, seq, worker_index, rank, stream, text,
                   adapted[at] if at in adapted else adapted.setdefault(at, adapt_time(at)))
    # Django's SQLite cursor turns each %s into ? with a regular expression, on every statement: a fifth
    # of the store's time a line. There the statement is written with ? and goes to the driver itself, its
    # errors still raised as Django's (the sink retries an OperationalError), in the same transaction.
    sqlite = connection.vendor == "sqlite"
    row_marks = f"({', '.join(['?' if sqlite else '%s'] * width)})"
    statements = [(f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES {', '.join([row_marks] * count)}",
                   values[first * width:(first + count) * width])
                  for first in range(0, len(lines), per_statement)
                  for count in [min(per_statement, len(lines) - first)]]
    if sqlite:
        connection.ensure_connection()
        with connection.wrap_database_errors:
            for sql, params in statements:
                connection.connection.execute(sql, params)
    else:
        with connection.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql, params)


def append_log_lines(job_id: int, records: list[LogRecord]) -> int:
    """Store records; returns the new last sequence number."""
    if not records:
        return TrainingJob.objects.filter(pk=job_id).values_list("log_line_count", flat=True).get()
    return store_lines(job_id, records).last_seq


def service_line(job_id: int, text: str, worker_index: int | None = None) -> int:
    return append_log_lines(job_id, [LogRecord(text=text, stream=LogStream.SYSTEM, worker_index=worker_index)])


# Reading.

@dataclass
class LogPage:
    lines: list[StoredLogLine]
    # Reading on: pass `next` as `after`. `more` says stored lines lie beyond it already.
    next: int | None
    more: bool = False
    # Reading back: pass `previous` as `before`; None once the start of the log is reached.
    previous: int | None = None


def stored_line_count(job_id: int) -> int:
    return TrainingJob.objects.filter(pk=job_id).values_list("log_line_count", flat=True).get()


def read_after(job_id: int, after: int, query: dict, limit: int, *, total: int | None = None,
               window: int = SCAN_WINDOW) -> LogPage:
    """Matching lines numbered above `after`, looking at no more than `window` numbers.

    `total` is the job's line count read before the lines: every line up to it is committed, so the
    cursor never passes a line that is not visible yet.
    """
    total = stored_line_count(job_id) if total is None else total
    upper = min(after + window, total)
    if upper <= after:
        return LogPage([], after, False)
    rows = _stored(LogLine.objects.filter(job_id=job_id, seq__gt=after, seq__lte=upper)
                   .filter(line_filter(query)).order_by("seq")[:limit])
    # The cursor follows the rows the database gave, not the lines a pattern or level kept of them.
    cursor = rows[-1].seq if len(rows) == limit else upper
    return LogPage(_kept(rows, query), cursor, cursor < total)


def read_before(job_id: int, before: int, query: dict, limit: int, *, total: int | None = None,
                window: int = SCAN_WINDOW) -> LogPage:
    """Matching lines numbered below `before`, the latest `limit` of them, oldest first: the tail, or older lines."""
    total = stored_line_count(job_id) if total is None else total
    before = min(before, total + 1)
    lower = max(before - 1 - window, 0)
    newest_first = _stored(LogLine.objects.filter(job_id=job_id, seq__gt=lower, seq__lt=before)
                           .filter(line_filter(query)).order_by("-seq")[:limit])
    rows = newest_first[::-1]
    previous = rows[0].seq if len(rows) == limit else lower + 1
    return LogPage(_kept(rows, query), None, previous=previous if previous > 1 else None)


def _kept(rows: list[StoredLogLine], query: dict) -> list[StoredLogLine]:
    """The rows the SQL filters gave that the pattern and the level keep too."""
    match = line_match(query)
    return rows if match is None else [row for row in rows if match(row.text)]


# What a terminal acts on when a downloaded log is printed or a plain-text read lands in one: C0 controls but
# tab, DEL, and C1 controls (0x9b alone starts an escape sequence). Lines are stored as the program wrote them.
TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
LONE_SURROGATES = re.compile("[\ud800-\udfff]")


def neutralise_controls(text: str) -> str:
    """The text with each terminal control written as a visible escape (ESC as `\\x1b`), tab kept, and any
    unpaired surrogate (not text, cannot be encoded) as U+FFFD."""
    text = TERMINAL_CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
    return LONE_SURROGATES.sub("\ufffd", text)


def render_text(stream: str, rank: int | None, text: str) -> str:
    """A line as the per-worker log files show it: the platform's lines marked, ranks tagged, mpirun's own
    lines tagged too, and terminal controls neutralised (this is the text of the download and of the
    plain-text API). Only the console's own lines (the system stream, which nothing a job prints can
    reach) start with the platform's mark: every line of the job's output starts with its source's tag."""
    text = neutralise_controls(text)
    if stream == LogStream.SYSTEM:
        return f"{SERVICE_LOG_PREFIX}{text}"
    if rank is not None:
        return f"[rank {rank}] {text}"
    return f"{MPIRUN_LINE_PREFIX}{text}"


def render_line(line: LogLine | StoredLogLine) -> str:
    return render_text(line.stream, line.rank, line.text)


def lines_after(job_id: int, after_seq: int, limit: int = 1000) -> list[StoredLogLine]:
    """The lines after a cursor, unfiltered: the run's monitor and the plain-text API read every line this way."""
    return _stored(LogLine.objects.filter(job_id=job_id, seq__gt=after_seq).order_by("seq")[:limit])


def rendered_chunk(job_id: int, query: dict, after: int, through: int,
                   lines: int = DOWNLOAD_CHUNK_LINES) -> tuple[str, int | None]:
    """The next matching lines above `after` (up to `through`) as file text, and the cursor after them (None: done)."""
    rows = list(LogLine.objects.filter(job_id=job_id, seq__gt=after, seq__lte=through)
                .filter(line_filter(query)).order_by("seq").values_list("seq", "stream", "rank", "text")[:lines])
    if not rows:
        return "", None
    match = line_match(query)
    return "".join(render_text(stream, rank, text) + "\n" for _seq, stream, rank, text in rows
                   if match is None or match(text)), rows[-1][0]


def first_error(job_id: int, query: dict, after: int = 0) -> LogLine | None:
    """The first line above `after` that looks like an error: a traceback, an exception or error name,
    an NCCL warning, a non-zero exit code."""
    candidates = LogLine.objects.filter(job_id=job_id).filter(ERROR_CANDIDATES).filter(line_filter(query))
    match = line_match(query)
    while True:
        chunk = list(candidates.filter(seq__gt=after).order_by("seq")[:ERROR_CANDIDATE_CHUNK])
        for line in chunk:
            if looks_like_error(line.text) and (match is None or match(line.text)):
                return line
        if len(chunk) < ERROR_CANDIDATE_CHUNK:
            return None
        after = chunk[-1].seq
