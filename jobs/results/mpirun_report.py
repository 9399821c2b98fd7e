"""mpirun's own words: the first failure it names in its untagged lines (a lost daemon, a rank's signal...),
and the messages Open MPI framed in lines of dashes (its warnings: an unknown interface, a parameter it ignored).

Pure.
"""

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MpirunReport:
    kind: str = ""
    rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    node: str = ""
    excerpt: str = ""


# In order of how much they explain: a lost daemon explains the ranks' deaths that follow it.
MPIRUN_PATTERNS = [
    ("daemon_lost", re.compile(r"ORTE has lost communication with a remote daemon\.[\s\S]*?Remote daemon:\s*\S+ on node (?P<node>\S+)")),
    ("daemon_failed", re.compile(r"An ORTE daemon has unexpectedly failed after launch")),
    ("unreachable", re.compile(r"ssh: connect to host (?P<node>\S+) port \d+: .+|ssh: Could not resolve hostname (?P<node2>[^\s:]+)")),
    ("daemon_start", re.compile(r"ORTE was unable to reliably start one or more daemons|A daemon died unexpectedly")),
    ("slots", re.compile(r"There are not enough slots available in the system to satisfy the (?P<slots>\d+)\s+slots")),
    ("not_executable", re.compile(r"could not access\s+or execute an executable:\s+Executable:\s*(?P<exe>\S+)\s+Node:\s*(?P<node>\S+)")),
    ("not_found", re.compile(r"unable to find the specified executable file[\s\S]*?Node:\s*(?P<node>\S+)")),
    ("signal", re.compile(r"process rank (?P<rank>\d+) with PID \d+ on node (?P<node>\S+) exited on signal (?P<signal>\d+)")),
    ("abort", re.compile(r"MPI_ABORT was invoked on rank (?P<rank>\d+) in communicator .+?\s+with errorcode (?P<code>-?\d+)")),
    ("abort", re.compile(r"due to process rank (?P<rank>\d+) with PID \d+ on\s+node (?P<node>\S+) calling \"abort\"")),
    ("exit_code", re.compile(r"Process name:\s*\[\[\d+,\d+\],(?P<rank>\d+)\]\s*\n\s*Exit code:\s*(?P<code>-?\d+)")),
    ("improper_exit", re.compile(r"due to process rank (?P<rank>\d+) with PID \d+ on\s+node (?P<node>\S+) exiting improperly")),
]


def parse_mpirun_output(lines: list[str]) -> MpirunReport:
    """The first failure mpirun names in its own (untagged) lines."""
    text = "\n".join(lines)
    for kind, pattern in MPIRUN_PATTERNS:
        match = pattern.search(text)
        if not match:
            continue
        groups = {key: value for key, value in match.groupdict().items() if value is not None}
        return MpirunReport(
            kind=kind,
            rank=int(groups["rank"]) if "rank" in groups else None,
            exit_code=int(groups["code"]) if "code" in groups else None,
            signal=int(groups["signal"]) if "signal" in groups else None,
            node=groups.get("node") or groups.get("node2") or "",
            excerpt=_excerpt(text, match),
        )
    return MpirunReport()


def _excerpt(text: str, match: re.Match) -> str:
    # mpirun frames its messages with dashes; the block around the match is its whole message.
    start = text.rfind("-----\n", 0, match.start())
    end = text.find("\n-----", match.end())
    block = text[start + 6 if start >= 0 else match.start(): end if end >= 0 else match.end()]
    return "\n".join(line for line in block.strip().splitlines()[:12])



# Open MPI prints each of its help messages between two lines of dashes (74 of them).
FRAME_LINE = re.compile(r"^-{20,}\s*$")
WARNING_START = "WARNING:"
MESSAGES_KEPT = 3
MESSAGE_LINES_KEPT = 12


def framed_messages(lines: list[str]) -> list[str]:
    """The messages Open MPI framed in lines of dashes, in order. The lines must begin outside a frame (mpirun's
    first lines do): which dash line opens a frame and which closes one is told by counting."""
    messages: list[str] = []
    body: list[str] | None = None
    for line in lines:
        if FRAME_LINE.match(line):
            if body is None:
                body = []
                continue
            while body and not body[-1].strip():
                body.pop()
            if body:
                messages.append("\n".join(line.rstrip() for line in body[:MESSAGE_LINES_KEPT]))
            body = None
        elif body is not None:
            body.append(line)
    return messages


def mentions(text: str, word: str) -> bool:
    """Whether `word` stands in the text as a word of its own (a name, a value), not inside a longer one."""
    return re.search(rf"(?<![\w.-]){re.escape(word)}(?![\w.-])", text) is not None


def openmpi_messages(lines: list[str], words: tuple[str, ...] = ()) -> list[str]:
    """Open MPI's warnings among mpirun's first lines, and the framed messages that mention one of `words` (a
    job's own MCA parameters and values: what Open MPI says of them is not always a warning), each once."""
    kept: list[str] = []
    for message in framed_messages(lines):
        warns = message.lstrip().startswith(WARNING_START)
        if (warns or any(mentions(message, word) for word in words)) and message not in kept:
            kept.append(message)
    return kept[:MESSAGES_KEPT]
