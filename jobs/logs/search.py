"""Searching a whole log: reading back through every stored line for the matches of a filter, and counting them.

A plain read looks at a bounded stretch of the log (SCAN_WINDOW numbers), so that a follower's turn stays
short. A search must not stop there: a reader who filters a 200,000-line log for a line near its start
has to get that line, and must never be told "no match" for lines nobody looked at. So a search reads
back stretch after stretch until it has a page of matches, reaches the start, or has looked for
SEARCH_SECONDS; what it answers says where it stopped (`previous`), and the reader asks again from there.
A count goes the same way: in one statement where the database decides alone, in steps that say where
they stopped where a pattern or a level must be checked line by line.
"""

import time
from dataclasses import dataclass

from jobs.logs.matching import line_filter, line_match
from jobs.logs.store import SCAN_WINDOW, LogPage, read_before
from jobs.models import LogLine

# How long one search or count may look before it answers with what it has and where it stopped.
SEARCH_SECONDS = 1.0
# The lines a count checks in Python at a time, and the rows a search with a pattern or a level reads at once.
COUNT_CHUNK_LINES = 5000
SEARCH_BATCH_LINES = 2000


def search_before(job_id: int, before: int, query: dict, limit: int, *, total: int,
                  seconds: float = SEARCH_SECONDS, window: int = SCAN_WINDOW) -> LogPage:
    """The latest `limit` matching lines below `before`, oldest first, looked for back through the whole
    log. `previous` is where to go on reading back (None: the start was reached); every line from it up
    to `before` has been looked at, so fewer than `limit` lines with a `previous` means "not searched
    further yet", not "no more matches"."""
    deadline = time.monotonic() + seconds
    # Where a pattern or a level keeps only some of the rows the database gives, each read asks for a batch,
    # not for the few lines still missing: a page nearly full would otherwise cost a query a row.
    batch = SEARCH_BATCH_LINES if line_match(query) is not None else 0
    lines: list = []
    previous: int | None = before
    while previous is not None and len(lines) < limit:
        missing = limit - len(lines)
        page = read_before(job_id, previous, query, max(missing, batch), total=total, window=window)
        found, previous = page.lines, page.previous
        if len(found) > missing:
            # More than the page takes: the older ones are read again next time, from the first line kept.
            found = found[-missing:]
            previous = found[0].seq if found[0].seq > 1 else None
        lines = found + lines
        if time.monotonic() >= deadline:
            break
    return LogPage(lines, None, previous=previous)


@dataclass(frozen=True)
class MatchCount:
    count: int
    # Counted up to here; None once every line up to `through` is counted. Ask again with it as `after`.
    next: int | None
    through: int


def count_matches(job_id: int, query: dict, *, after: int, through: int,
                  seconds: float = SEARCH_SECONDS) -> MatchCount:
    """How many lines numbered above `after`, up to `through`, match the filters."""
    rows = LogLine.objects.filter(job_id=job_id, seq__gt=after, seq__lte=through).filter(line_filter(query))
    match = line_match(query)
    if match is None:
        return MatchCount(rows.count(), None, through)
    deadline, count = time.monotonic() + seconds, 0
    while True:
        chunk = list(rows.filter(seq__gt=after).order_by("seq").values_list("seq", "text")[:COUNT_CHUNK_LINES])
        count += sum(1 for _seq, text in chunk if match(text))
        if len(chunk) < COUNT_CHUNK_LINES:
            return MatchCount(count, None, through)
        after = chunk[-1][0]
        if time.monotonic() >= deadline:
            return MatchCount(count, after, through)
