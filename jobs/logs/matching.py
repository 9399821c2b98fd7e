"""Which lines a log reader asks for: the filters the database applies, and what only Python can decide.

Most of a filter is SQL (worker, rank, stream, the platform's lines, a case-blind substring). Two parts
are not: a regular expression, in RE2 so that no pattern can hold a reader for long (it runs in time
linear in the line), and a level, decided by the same expressions as "First error". For those, the SQL
only narrows the candidates where it can and `line_match` decides for each line that comes back.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import re2
from django.db.models import Q

from jobs.models import LogStream

# What "jump to first error" and the error level look for. The SQL below only narrows the candidates
# (LIKE is case-blind on SQLite); this expression decides.
ERROR_LINE = re.compile(
    r"Traceback \(most recent call last\)|\b\w*Error\b|\bERROR\b|\b\w*Exception\b|NCCL WARN"
    r"|non-zero (?:exit code|status)|exited on signal|return code: (?!0\b)"
    # A program's own "error:" as argparse, compilers and most tools print it ("train.py: error: argument ...").
    r"|(?:^|: )(?:fatal )?error: "
)
ERROR_CANDIDATES = (
    Q(text__icontains="error") | Q(text__icontains="traceback") | Q(text__icontains="exception")
    | Q(text__contains="NCCL WARN") | Q(text__icontains="non-zero") | Q(text__icontains="exited on signal")
    | Q(text__icontains="return code: ")
)
# A warning as programs print one: Python's warnings (UserWarning, DeprecationWarning: ...), logging's
# WARNING and glog's W-lines' "WARN", Open MPI's boxed "WARNING:". Any error counts as a warning too.
WARNING_LINE = re.compile(r"\b\w*Warning\b|\bWARN(?:ING)?\b")
WARNING_CANDIDATES = ERROR_CANDIDATES | Q(text__icontains="warn")


class Level:
    """The level filter's choices: every line, lines that look like warnings or errors, errors only."""

    ANY = ""
    WARNING = "warning"
    ERROR = "error"
    CHOICES = [(ANY, "any"), (WARNING, "warning"), (ERROR, "error")]


def looks_like_error(text: str) -> bool:
    return ERROR_LINE.search(text) is not None


def looks_like_warning(text: str) -> bool:
    return WARNING_LINE.search(text) is not None or looks_like_error(text)


@lru_cache(maxsize=64)
def compile_search_pattern(pattern: str) -> Any:
    """The reader's pattern in RE2; raises re2.error where it is not RE2 (a back-reference, a lookaround)."""
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the reader's field error, not a line on stderr
    return re2.compile(pattern, options)


def line_filter(query: dict) -> Q:
    """The filters the database applies. `query` is a LogQueryForm's cleaned data (missing keys filter nothing).

    A worker's lines are what the reference platform's per-worker file holds: that worker's own lines
    (its ranks' output, its platform steps; mpirun's own words are worker-0's) and the job-wide platform lines.
    """
    condition = Q()
    if query.get("worker") is not None:
        condition &= Q(worker_index=query["worker"]) | Q(worker_index__isnull=True, stream=LogStream.SYSTEM)
    if query.get("rank") is not None:
        condition &= Q(rank=query["rank"])
    if query.get("stream"):
        condition &= Q(stream=query["stream"])
    if not query.get("system", True):
        condition &= ~Q(stream=LogStream.SYSTEM)
    if query.get("q") and not query.get("regex"):
        condition &= Q(text__icontains=query["q"])
    if query.get("level") == Level.ERROR:
        condition &= ERROR_CANDIDATES
    elif query.get("level") == Level.WARNING:
        condition &= WARNING_CANDIDATES
    return condition


@dataclass(frozen=True)
class LineMatch:
    """What a line's text must hold beyond the SQL filters: a pattern's match, a level, or both."""

    pattern: Any | None
    level: str

    def __call__(self, text: str) -> bool:
        if self.pattern is not None and self.pattern.search(text) is None:
            return False
        if self.level == Level.ERROR:
            return looks_like_error(text)
        if self.level == Level.WARNING:
            return looks_like_warning(text)
        return True


def line_match(query: dict) -> Callable[[str], bool] | None:
    """The part of the filters the database cannot do, or None where the SQL alone decides."""
    pattern = compile_search_pattern(query["q"]) if query.get("q") and query.get("regex") else None
    level = query.get("level") or Level.ANY
    if pattern is None and level == Level.ANY:
        return None
    return LineMatch(pattern, level)


def searches_text(query: dict) -> bool:
    """The filters pick lines by what they say (a text, a pattern, a level), not only by where they come from."""
    return bool(query.get("q") or query.get("level"))
