"""The suites' tables, printed at the end of a run and written to test-output/:
- the fault suite: each test marked `@pytest.mark.fault(fault, required outcome)` is a row;
- the attack suite: each test marked `@pytest.mark.attack(what was tried, what must hold)` is a row.
Each row says whether its outcome held in this run."""

from dataclasses import dataclass, field

import pytest

from tests.integration.helpers import TEST_OUTPUT


@dataclass
class Row:
    tried: str
    required: str
    test: str
    result: str = "not run"


@dataclass
class SuiteTable:
    marker: str
    title: str
    headings: tuple[str, str]
    file_name: str
    rows: dict[str, Row] = field(default_factory=dict)

    def render(self) -> str:
        lines = [f"| {self.headings[0]} | {self.headings[1]} | in this run |", "|---|---|---|"]
        lines += [f"| {row.tried} | {row.required} | {row.result} |" for row in self.rows.values()]
        return "\n".join(lines) + "\n"


TABLES = [
    SuiteTable("fault", "faults: what was injected, and whether the required outcome held",
               ("fault", "required outcome"), "fault-table.md"),
    SuiteTable("attack", "attacks: what was tried, and whether what must hold held",
               ("attack", "what must hold"), "attack-table.md"),
]


def collect_rows(items: list[pytest.Item]) -> None:
    for item in items:
        for table in TABLES:
            marker = item.get_closest_marker(table.marker)
            if marker is not None:
                tried, required = marker.args
                callspec = getattr(item, "callspec", None)
                if callspec is not None:  # one row per case of a parametrized test, named by its case
                    tried = f"{tried} [{callspec.id}]"
                table.rows[item.nodeid] = Row(tried, required, item.nodeid.split("::")[-1])


def record_result(report: pytest.TestReport) -> None:
    for table in TABLES:
        row = table.rows.get(report.nodeid)
        if row is None:
            continue
        if report.failed:
            row.result = "FAILED" if report.when == "call" else f"error in {report.when}"
        elif report.skipped:
            row.result = "skipped"
        elif report.when == "call" and row.result == "not run":
            row.result = "held"


def write_tables(terminalreporter) -> None:
    for table in TABLES:
        if not table.rows or all(row.result == "not run" for row in table.rows.values()):
            continue
        text = table.render()
        terminalreporter.section(table.title)
        terminalreporter.write(text)
        TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
        (TEST_OUTPUT / table.file_name).write_text(text)
