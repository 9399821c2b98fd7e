"""How each rank of a job ended, as its fork agent recorded it, and how a process's end reads in words.

Each rank runs under the fork agent (runtime/node_scripts/rank-agent.sh), which records its exit
status or signal in the container; the teardown prints those records and parse_rank_records reads
them. Pure.
"""

import re
import signal as signals
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RankRecord:
    rank: int
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    # A signal the rank was sent before it ended: mpirun ending the other ranks, or a stop.
    stop_signal: str = ""
    # The worker whose container held the record: the teardown knows it, nothing recomputes it.
    worker: int | None = None

    @property
    def failed(self) -> bool:
        return bool(self.signal) or (self.exit_code is not None and self.exit_code != 0)

    @property
    def failed_by_itself(self) -> bool:
        return self.failed and not self.stop_signal


RECORD_LINE = re.compile(r"^rank-record rank=(\d+) ended=(\d+(?:\.\d+)?)?(?P<rest>.*)$")
RECORD_TOKEN = re.compile(r"\b(exit|signal|stop)=([A-Z0-9]{1,8})\b")


def parse_rank_records(output: str, worker: int | None = None) -> list[RankRecord]:
    """The records in a teardown's output; the files are the job user's, so only known tokens are read."""
    records = []
    for line in output.splitlines():
        match = RECORD_LINE.match(line.strip())
        if not match:
            continue
        values: dict[str, str] = {}
        for key, value in RECORD_TOKEN.findall(match.group("rest")):
            # The first stop signal is what ended the rank; later ones are mpirun's follow-up.
            values.setdefault(key, value)
        records.append(
            RankRecord(
                rank=int(match.group(1)),
                worker=worker,
                ended_at=float(match.group(2)) if match.group(2) else None,
                exit_code=_int(values.get("exit")),
                signal=_int(values.get("signal")),
                stop_signal=values.get("stop", "") if not values.get("stop", "").isdigit() else "",
            )
        )
    return records


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


# How a process ended, in words.

def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


# What exit code 139 most often comes from; a failure card that knows the cause leaves the guess out.
SEGFAULT_GUESS = ", often a library conflict"


def describe_end(exit_code: int | None, signal: int | None) -> tuple[str, str]:
    """(kind, words) for an end: kind is one of exit_code, oom, segfault, signal, not_found, ok, unknown."""
    if signal:
        if signal == signals.SIGKILL:
            return "oom", "killed by signal 9 (SIGKILL): most often the out-of-memory killer"
        if signal == signals.SIGSEGV:
            return "segfault", "segmentation fault (signal 11, SIGSEGV)"
        text = signals.strsignal(signal) or signal_name(signal)
        return "signal", f"ended by signal {signal} ({signal_name(signal)}: {text})"
    if exit_code is None:
        return "unknown", "no exit status recorded"
    if exit_code == 0:
        return "ok", "exit code 0"
    if exit_code in (137, 247):
        return "oom", f"exit code {exit_code}: killed, most often for running out of memory"
    if exit_code == 139:
        return "segfault", f"exit code 139: a segmentation fault{SEGFAULT_GUESS}"
    if exit_code == 127:
        return "not_found", "exit code 127: the program or its interpreter was not found"
    if exit_code == 126:
        return "not_found", "exit code 126: the program could not be executed"
    return "exit_code", f"exit code {exit_code}"


class RecordedEnd(Protocol):
    exit_code: int | None
    signal: int | None
    stop_signal: str


def describe_outcome(outcome: RecordedEnd) -> str:
    """A RankOutcome (or anything with exit_code, signal and stop_signal) in words, for the per-rank table."""
    words = describe_end(outcome.exit_code, outcome.signal)[1]
    if outcome.stop_signal:
        return f"{words}, after SIG{outcome.stop_signal} was sent to it"
    return words
