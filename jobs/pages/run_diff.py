"""Comparing runs, computed from plain values: which ids were asked for, what differs between the runs, and
their final metrics and durations side by side. The comparison page, the API and `tc compare` show these;
gathering the values from the jobs (masked, as the job page shows them) is jobs.pages.comparison's."""

import re
from typing import TypedDict

from django.utils.translation import gettext as _

MIN_RUNS = 2
MAX_RUNS = 10
# Ids as a reader types them: "3,5,8", "3 5 8", "#3, #5".
ID_SEPARATORS = re.compile(r"[\s,]+")


class CompareIdsError(ValueError):
    """The ids asked for cannot be compared; the message says why, in the reader's words."""


class RunFacts(TypedDict):
    """One run as the comparison sees it: its id and name, and by section ("parameters", "environment", ...)
    each setting's value as text, secrets already masked."""

    id: int
    name: str
    sections: dict[str, dict[str, str]]
    # The (section, key) pairs whose value here is a secret: compared as they are, never shown.
    secrets: list[tuple[str, str]]


class DifferingRow(TypedDict):
    """A setting whose value is not the same in every run: one value per run, in the runs' order (None where a
    run has no such setting)."""

    section: str
    key: str
    values: list[str | None]


class SideBySideRow(TypedDict):
    """One final metric (or the duration): each run's value, None where a run has none."""

    name: str
    values: list[float | None]


def compare_ids(given: list[str], minimum: int = MIN_RUNS, maximum: int = MAX_RUNS) -> list[int]:
    """The job ids in `given` (each item may hold several, separated by commas or spaces, with or without #),
    in the order given, each once; CompareIdsError when one is not an id or there are too few or too many."""
    ids: list[int] = []
    for item in given:
        for word in ID_SEPARATORS.split(item.strip()):
            if not word:
                continue
            digits = word.removeprefix("#")
            if not (digits.isascii() and digits.isdigit()) or len(digits) > 18 or int(digits) == 0:
                raise CompareIdsError(_("%(word)s is not a job id.") % {"word": word[:40]})
            if int(digits) not in ids:
                ids.append(int(digits))
    if not minimum <= len(ids) <= maximum:
        raise CompareIdsError(_("Compare from %(min)s to %(max)s jobs; %(count)s given.") % {
                "min": minimum, "max": maximum, "count": len(ids)})
    return ids


def differing_rows(runs: list[RunFacts]) -> list[DifferingRow]:
    """The settings whose values are not all the same, section by section in the order they first appear,
    keys in the order they first appear within a section. A setting absent from some runs differs."""
    rows: list[DifferingRow] = []
    sections: list[str] = []
    for run in runs:
        sections.extend(section for section in run["sections"] if section not in sections)
    for section in sections:
        keys: list[str] = []
        for run in runs:
            keys.extend(key for key in run["sections"].get(section, {}) if key not in keys)
        for key in keys:
            values = [run["sections"].get(section, {}).get(key) for run in runs]
            if len(set(values)) > 1:
                rows.append({"section": section, "key": key, "values": values})
    return rows


def masked_rows(rows: list[DifferingRow], runs: list[RunFacts], mask: str, owns_all: bool = True) -> list[DifferingRow]:
    """The rows with each secret value (a secret in any run) replaced by the mask and a number per distinct
    value, so the owner sees that two secrets differ, and which runs share one, without seeing any. Whether two
    secrets are equal is something of theirs too: a reader who does not own every run gets no secret's row."""
    secret = {pair for run in runs for pair in run["secrets"]}
    shown: list[DifferingRow] = []
    for row in rows:
        if (row["section"], row["key"]) not in secret:
            shown.append(row)
            continue
        if not owns_all:
            continue
        distinct = list(dict.fromkeys(value for value in row["values"] if value is not None))
        shown.append({**row, "values": [None if value is None else f"{mask} ({distinct.index(value) + 1})"
                                        for value in row["values"]]})
    return shown


def side_by_side(finals: list[dict[str, float]], durations: list[float | None]) -> list[SideBySideRow]:
    """Each final metric any run has (in the order they first appear), then the duration in seconds."""
    names: list[str] = []
    for metrics in finals:
        names.extend(name for name in metrics if name not in names)
    rows: list[SideBySideRow] = [{"name": name, "values": [metrics.get(name) for metrics in finals]} for name in names]
    rows.append({"name": "duration_seconds", "values": list(durations)})
    return rows
