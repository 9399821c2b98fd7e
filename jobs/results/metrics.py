"""Metrics read from a job's log: definitions (a name and a regular expression, as SageMaker's metric
definitions are) and the extraction of values, with the step they belong to when the line says one.

Pure: no Django model or database here. The run monitor feeds stored log lines through a
MetricExtractor; the form checks user definitions with validate_metric_definitions.

A user's regular expression runs in RE2, whose matching time is linear in the line's length, so no
pattern (nested repetition, backtracking blow-ups) can freeze the worker that reads the log; what RE2
does not support (back-references, lookaround) is refused when the job is submitted.
"""

import bisect
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import re2
from django.utils.translation import gettext as _

logger = logging.getLogger(__name__)

# A number as programs print them: 0.5, -1, 3e-05, .25, 1.2E+3, and nan / inf.
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?i:nan|inf)"
# What the defaults catch: `loss=0.123`, `loss: 0.123`, `loss 0.123`, `accuracy=0.9`, `acc: 91.5%`,
# and the shipped example's `step=3 loss=0.123`; `val_loss`/`train_acc` are metrics of their own.
DEFAULT_METRIC_DEFINITIONS = [
    {"name": "loss", "regex": rf"(?:^|[^\w.])(?i:loss)\s*[=:]?\s*({NUMBER})"},
    {"name": "accuracy", "regex": rf"(?:^|[^\w.])(?i:accuracy|acc)\s*[=:]?\s*({NUMBER})"},
]
# The defaults jobs created before RE2 carry (with a lookbehind RE2 lacks); ours, so Python's re runs them.
LEGACY_DEFAULT_REGEXES = {
    rf"(?<![\w.])(?i:loss)\s*[=:]?\s*({NUMBER})",
    rf"(?<![\w.])(?i:accuracy|acc)\s*[=:]?\s*({NUMBER})",
}
# A step written on the same line: `step=3`, `step: 3`, `Step 3`, `iter 3`, `iteration=3`, `step 3/100`.
STEP = re.compile(r"(?<![\w.])(?:global_step|step|iteration|iter)\s*[=:]?\s*(\d+)", re.IGNORECASE)

MAX_DEFINITIONS = 20
MAX_REGEX_LENGTH = 500
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.:/-]{0,63}$")
# Regular expressions are the user's; a long line is cut before matching so one line cannot cost much.
MATCH_TEXT_LIMIT = 2000


class MetricDefinitionError(ValueError):
    """A definition that cannot be used; the message says which one and why."""


def default_metric_definitions() -> list[dict[str, str]]:
    return [dict(definition) for definition in DEFAULT_METRIC_DEFINITIONS]


def validate_metric_definitions(value) -> list[dict[str, str]]:  # noqa: C901 - one message per way a definition can be wrong
    """Definitions as a job keeps them: a list of {name, regex}, each regex compiling with one value to capture.

    The value is the regex's group named `value`, else its first group; a group named `step` gives the step.
    """
    if value in (None, "", []):
        return []
    if not isinstance(value, list):
        raise MetricDefinitionError(_("Give a list of {name, regex} objects."))
    if len(value) > MAX_DEFINITIONS:
        raise MetricDefinitionError(_("At most %(max)s metrics.") % {"max": MAX_DEFINITIONS})
    cleaned, seen = [], set()
    for position, item in enumerate(value, start=1):
        if not isinstance(item, dict) or set(item) - {"name", "regex"} or not {"name", "regex"} <= set(item):
            raise MetricDefinitionError(_("Metric %(position)s must be an object with a name and a regex.") % {"position": position})
        name, pattern = str(item["name"]).strip(), str(item["regex"])
        if not NAME_RE.match(name):
            raise MetricDefinitionError(
                _("Metric name %(name)s must start with a letter and hold at most 64 letters, digits or _ . : / -.")
                % {"name": repr(name)})
        if name in seen:
            raise MetricDefinitionError(_("Metric %(name)s is given twice.") % {"name": name})
        if not pattern.strip():
            raise MetricDefinitionError(_("Metric %(name)s: the regex is empty.") % {"name": name})
        if any(ord(character) < 32 and character != "\t" for character in pattern + name):
            raise MetricDefinitionError(_("Metric %(name)s: control characters (NUL, line breaks) are not allowed.")
                                        % {"name": repr(name)})
        if len(pattern) > MAX_REGEX_LENGTH:
            raise MetricDefinitionError(_("Metric %(name)s: the regex is longer than %(max)s characters.")
                                        % {"name": name, "max": MAX_REGEX_LENGTH})
        try:
            compiled = compile_user_regex(pattern)
        except re2.error as error:
            reason = error.args[0].decode(errors="replace") if error.args and isinstance(error.args[0], bytes) else error
            raise MetricDefinitionError(
                _("Metric %(name)s: the regex is not valid or uses what linear-time matching lacks (back-references, "
                  "lookahead, lookbehind): %(reason)s.") % {"name": name, "reason": reason}
            ) from None
        if compiled.groups == 0:
            raise MetricDefinitionError(
                _("Metric %(name)s: the regex captures nothing; put the value in a group, as in loss=(\\S+).") % {"name": name}
            )
        seen.add(name)
        cleaned.append({"name": name, "regex": pattern})
    return cleaned


@dataclass(frozen=True)
class ExtractedPoint:
    name: str
    value: float
    step: int | None


def compile_user_regex(pattern: str) -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the user's field error, not a line on stderr
    return re2.compile(pattern, options)


def _compiled(name: str, pattern: str) -> Any:
    if pattern in LEGACY_DEFAULT_REGEXES:
        return re.compile(pattern)
    try:
        return compile_user_regex(pattern)
    except re2.error:
        # Stored before patterns were checked for RE2: skipped rather than run with backtracking.
        logger.warning("metric %s: its regex is not RE2 and is not read", name)
        return None


# What keeps a pattern that matches a line alone from matching that line inside lines joined by newlines,
# once it runs multi-line: the start and end of the whole text, and turning multi-line off again.
ONE_TEXT_ONLY = re.compile(r"\\[Az]|\(\?[a-zA-Z]*-[a-zA-Z]*m")
# Lines in a row a definition's batch search found candidates on, past which every later line of the batch
# is taken as one.
DENSE_RUN = 4


def _batch_pattern(pattern: str) -> Any:
    """The user's RE2 pattern run multi-line over many lines joined by newlines, or None where it cannot be.

    Whatever it matches in one line alone it matches there among the others too: `^` and `$` match at each
    line's ends, a newline is no word character for `\b`, and RE2 has no lookaround to see past a line. It
    may match more (across a newline), so it only rules lines out; each line it leaves is matched alone.
    """
    if ONE_TEXT_ONLY.search(pattern):
        return None
    try:
        return compile_user_regex(f"(?m){pattern}")
    except re2.error:
        return None


def _candidate_lines(batch: Any, joined: bytes, starts: list[int]) -> list[int]:
    """The lines (by index) that a definition may match alone: before the first match of its batch pattern
    at or after a line's start, no line can hold a match (it would be a match further left)."""
    lines: list[int] = []
    position = 0
    while (found := batch.search(joined, position)) is not None:
        if len(lines) >= DENSE_RUN and lines[-DENSE_RUN] == lines[-1] - DENSE_RUN + 1:
            # A metric on line after line: searching ahead of each would only add a search a line.
            return [*lines, *range(lines[-1] + 1, len(starts))]
        # A match that began before the line searched from (at the newline in front of it) says only that
        # the next candidate is that line or a later one.
        index = bisect.bisect_right(starts, found.start()) - 1
        if lines:
            index = max(index, lines[-1] + 1)
        if index >= len(starts):
            break
        lines.append(index)
        if index + 1 == len(starts):
            break
        # From the newline before the next line: its start keeps the context `^` and `\b` look at.
        position = starts[index + 1] - 1
    return lines


class MetricExtractor:
    """Applies a job's definitions to log lines: one at a time, or a batch at once (extract_many)."""

    def __init__(self, definitions: list[dict[str, str]]):
        compiled = [(item["name"], item["regex"], _compiled(item["name"], item["regex"])) for item in definitions]
        # Which group holds the value, and whether one holds the step, asked once: the monitor runs every
        # definition on every line of a log.
        self.definitions = [(name, pattern, "value" if "value" in pattern.groupindex else 1, "step" in pattern.groupindex)
                            for name, _text, pattern in compiled if pattern is not None]
        # Each definition's pattern for a batch of lines (None: matched a line at a time). Python's re runs
        # only the legacy defaults, whose lookbehind could see past a line: those are matched line by line.
        self.batch_patterns = [None if isinstance(pattern, re.Pattern) else _batch_pattern(text)
                               for _name, text, pattern in compiled if pattern is not None]

    @property
    def names(self) -> list[str]:
        return [name for name, *_ in self.definitions]

    def extract(self, text: str) -> list[ExtractedPoint]:
        return self._extract(text[:MATCH_TEXT_LIMIT], self.definitions)

    def extract_many(self, texts: Sequence[str]) -> list[tuple[int, list[ExtractedPoint]]]:
        """What extract() finds in each of `texts`, for the lines where it finds anything: (index, points).

        A log's lines mostly hold no metric. Each definition first runs once over the batch joined by
        newlines, and again only from where it matched: the lines it rules out are never matched one by
        one (each call into RE2 costs about as much as the line's other work in the monitor)."""
        if not texts:
            return []
        texts = [text[:MATCH_TEXT_LIMIT] for text in texts]
        wanted: dict[int, list[tuple]] = {}
        # Made once, for the first definition that runs over the batch.
        joined: bytes = b""
        starts: list[int] = []
        for definition, batch in zip(self.definitions, self.batch_patterns, strict=True):
            if batch is not None and not starts:
                joined, starts = _joined(texts)
            for index in range(len(texts)) if batch is None else _candidate_lines(batch, joined, starts):
                wanted.setdefault(index, []).append(definition)
        found = []
        for index in sorted(wanted):
            points = self._extract(texts[index], wanted[index])
            if points:
                found.append((index, points))
        return found

    def _extract(self, text: str, definitions: list[tuple]) -> list[ExtractedPoint]:
        points = []
        line_step = None
        for name, pattern, value_group, has_step in definitions:
            match = pattern.search(text)
            if not match:
                continue
            value = _number(match.group(value_group))
            if value is None:
                continue
            step = _integer(match.group("step")) if has_step else None
            if step is None:
                if line_step is None:
                    found = STEP.search(text)
                    line_step = int(found.group(1)) if found else -1
                step = line_step if line_step >= 0 else None
            points.append(ExtractedPoint(name, value, step))
        return points


def _joined(texts: list[str]) -> tuple[bytes, list[int]]:
    """The lines joined by newlines, in UTF-8 as RE2 reads them (and as it reads one line), and where each starts."""
    encoded = [text.encode("utf-8") for text in texts]
    starts, position = [], 0
    for line in encoded:
        starts.append(position)
        position += len(line) + 1
    return b"\n".join(encoded), starts


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    cleaned = text.strip().rstrip("%,;")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    # JSON (the API, the charts) has no NaN or infinity; such a value is not drawn.
    return value if math.isfinite(value) else None


def _integer(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def downsample(points: list, limit: int, value=lambda point: point[1]) -> list:
    """At most about `limit` of a series' points, in order, for a chart: the first and the last, and each
    bucket's lowest and highest, so spikes and the latest value survive (a stride alone would drop them)."""
    thinning = Thinning(len(points), limit, value)
    for point in points:
        thinning.add(point)
    return thinning.finish()


class Thinning:
    """downsample() over a series read once, point by point, whose length is known first (a COUNT): the same points
    kept, holding no more than they are, so a series of millions of points is never in memory whole."""

    def __init__(self, length: int, limit: int, value=lambda point: point[1]):
        self.length, self.value = length, value
        # Fewer than 4 leaves no bucket between the ends: taken as 4, never as "keep everything".
        limit = max(limit, 4)
        self.keep_all = length <= limit
        self.buckets = max((limit - 2) // 2, 1)
        self.inner = length - 2
        self.seen = 0
        self.kept: list = []
        # The bucket being read (its number and where it ends), and its lowest and highest point so far.
        self.bucket = -1
        self.bucket_end = 1
        self.low: tuple[int, object] | None = None
        self.high: tuple[int, object] | None = None
        # The last point read, and whether it is among those kept (finish keeps it, as the series' end).
        self.last: object = None
        self.last_kept = True

    def add(self, point) -> None:
        index = self.seen
        self.seen += 1
        self.last, self.last_kept = point, index == 0 or self.keep_all or index >= self.length - 1
        if self.keep_all or index == 0:
            self.kept.append(point)
            return
        if index >= self.length - 1:
            self._close_bucket()
            self.kept.append(point)
            return
        if index >= self.bucket_end:
            self._close_bucket()
            while index >= self.bucket_end:  # a bucket of no point (a short series) is passed over
                self.bucket += 1
                self.bucket_end = 1 + (self.bucket + 1) * self.inner // self.buckets
        # The first lowest and the first highest, as min() and max() keep them.
        if self.low is None or self.value(point) < self.value(self.low[1]):
            self.low = (index, point)
        if self.high is None or self.value(point) > self.value(self.high[1]):
            self.high = (index, point)

    def finish(self) -> list:
        """The points kept, once the series is read. A series shorter than its count said still ends with its last
        point (after its open bucket's), so the latest value is always drawn."""
        self._close_bucket()
        if not self.last_kept:
            if not self.kept or self.kept[-1] is not self.last:
                self.kept.append(self.last)
            self.last_kept = True
        return self.kept

    def _close_bucket(self) -> None:
        if self.low is not None and self.high is not None:
            ends = [self.low] if self.low[0] == self.high[0] else sorted([self.low, self.high], key=lambda end: end[0])
            self.kept.extend(point for _, point in ends)
        self.low = self.high = None
