"""What NCCL really did, read from its NCCL_DEBUG=INFO log, and what that means for a job.

A plain Python package: no Django, nothing from the console, so a worker, a script or a
laptop can use it (`python -m nccl FILE [--json]` prints the same report as
`manage.py ncclsummary`).

* `parse_nccl_file(path)`, `parse_nccl_text(text)`, `parse_nccl_log(lines)`: one pass over a
  raw log, as printed;
* `NcclLogReader`: a log read as it grows, fed raw lines (`feed_line`) or the structured
  records a launcher stored (`feed_record(rank, stream, text)`), with a `summary()` at any time;
* `NcclSummary`: the facts (`to_dict()` gives plain JSON types); `format_summary_text` renders it;
* `diagnose(summary, promised_network=..., node_count=...)`: `Finding`s in plain words against
  what the job spec promised.

Modules: `patterns` (regular expressions), `parser` (the collector), `network` and `problems`
(the facts about the network and about warnings and errors the collector hands on to them),
`summary`, `diagnosis`, `cli`.
"""

from .diagnosis import Finding, diagnose
from .parser import NcclLogReader, parse_nccl_file, parse_nccl_log, parse_nccl_text, read_bounded_lines
from .summary import NcclSummary, format_summary_text

__all__ = [
    "Finding",
    "NcclLogReader",
    "NcclSummary",
    "diagnose",
    "format_summary_text",
    "parse_nccl_file",
    "parse_nccl_log",
    "parse_nccl_text",
    "read_bounded_lines",
]
