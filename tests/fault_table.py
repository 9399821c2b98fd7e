"""The fault suite's table: each test marked `@pytest.mark.fault(fault, required outcome)` becomes a row,
with whether the outcome held in this run; printed at the end and written to test-output/fault-table.md."""

from dataclasses import dataclass

import pytest

from tests.integration.helpers import TEST_OUTPUT


@dataclass
class FaultRow:
    fault: str
    required: str
    test: str
    result: str = "not run"


ROWS: dict[str, FaultRow] = {}


def collect_fault_rows(items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("fault")
        if marker is not None:
            fault, required = marker.args
            ROWS[item.nodeid] = FaultRow(fault, required, item.nodeid.split("::")[-1])


def record_fault_result(report: pytest.TestReport) -> None:
    row = ROWS.get(report.nodeid)
    if row is None:
        return
    if report.failed:
        row.result = "FAILED" if report.when == "call" else f"error in {report.when}"
    elif report.skipped:
        row.result = "skipped"
    elif report.when == "call":
        row.result = "held"


def fault_table() -> str:
    lines = ["| fault | required outcome | in this run |", "|---|---|---|"]
    lines += [f"| {row.fault} | {row.required} | {row.result} |" for row in ROWS.values()]
    return "\n".join(lines) + "\n"


def write_fault_table(terminalreporter) -> None:
    if not ROWS or all(row.result == "not run" for row in ROWS.values()):
        return
    table = fault_table()
    terminalreporter.section("faults: what was injected, and whether the required outcome held")
    terminalreporter.write(table)
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    (TEST_OUTPUT / "fault-table.md").write_text(table)
