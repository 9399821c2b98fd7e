"""`tc compare ID ID ...`: 2-10 jobs side by side, as the console's compare page shows them (what differs,
their final metrics and durations); --json prints the API's answer, the metric series included."""

from .api import Client
from .documents import CELL_CONTROLS, dumps, visible


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return printable(str(value))


def printable(text: str) -> str:
    """A cell on its line with no control left to act on the terminal: a job's values (or another's the user may
    see) may hold escape sequences."""
    return visible(text, CELL_CONTROLS)


def comparison_text(answer: dict) -> str:
    """The comparison as a plain table: one column per job."""
    runs = answer["runs"]
    header = ["", *(printable(f"#{run['id']} {run['name']}") for run in runs)]
    rows = [header, ["state", *(printable(run["status"]) for run in runs)]]
    rows += [[printable(f"{row['section']}: {row['key']}"), *map(_cell, row["values"])] for row in answer["differences"]]
    rows += [[printable(row["name"]), *map(_cell, row["values"])] for row in answer["finals"]]
    widths = [max(len(str(row[column])) for row in rows) for column in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    if not answer["differences"]:
        lines.append("(their settings are the same)")
    return "\n".join(lines)


def run_compare(client: Client, ids: list[int], every_rank: bool, as_json: bool) -> int:
    answer = client.get("training-jobs/compare", ids=",".join(str(job) for job in ids),
                        rank="all" if every_rank else "0")
    print(dumps(answer) if as_json else comparison_text(answer))
    return 0
