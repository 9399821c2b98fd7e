"""mpirun's tagged output, read back into each rank's lines.

With orte_tag_output, mpirun (Open MPI 4) puts "[jobid,rank]<stream>:" in front of every piece of a
rank's output it forwards, and after every newline inside a piece, but a piece need not end a line.
A program that writes a line in two writes (unbuffered Python writes the text, then the newline) comes
out as "[1,3]<stdout>:text[1,3]<stdout>:" + newline, and another rank's piece can land in between:
"[1,0]<stdout>:SEQ 0 0[1,2]<stdout>:SEQ 2 0" + newline, then "[1,0]<stdout>:" + newline later.

So the output is read as a stream of tags, text and newlines: text belongs to the rank of the last
tag on its physical line, and a rank's line is complete when a newline follows a piece of that rank.
Text before any tag on a physical line is mpirun's own (failures to launch, aborts; it runs on worker-0).
Every tag in the stream is mpirun's: a rank's output reaches Open MPI through its agent's sealed filter,
which breaks anything tag-shaped that the rank printed ("[1,3] <stdout>:"), and no process of the job
can write into mpirun's output beside it (see node_scripts/seal-tools.sh and rank-agent.sh). Only ASCII
digits make a tag, as the filter sees them.
Each rank's unfinished line is held up to a limit, so memory does not grow with a line that never ends.
"""

import re
from collections.abc import Sequence
from datetime import datetime
from typing import TypedDict

from django.utils import timezone

from jobs.launch.plan import worker_of_rank
from jobs.logs.store import LogRecord
from jobs.models import LogStream

TAG = re.compile(r"\[([0-9]+),([0-9]+)\]<(stdout|stderr|stddiag)>:")
# What the end of a chunk may hold of a tag that the next chunk completes.
TAG_START = re.compile(r"\[[0-9]*(?:,[0-9]*(?:\](?:<[a-z]*>?)?)?)?")
LONGEST_TAG = 48
# Tags whose meaning is kept at hand: more than a job's ranks have (a rank's three streams), fewer than
# would let tags of ranks a job does not have fill memory.
MAX_SOURCES = 4096
CUT_MARK = " …[line cut]"


class ReaderState(TypedDict, total=False):
    """An MpirunOutput between two chunks (kept in TrainingJob.launch_cursor)."""

    carry: str
    current: list | None  # [rank, stream], or None for mpirun's own text
    pending: list[list]  # [rank or None, stream or None, the line's text so far]


class MpirunOutput:
    """One of mpirun's output streams (its stdout or its stderr), fed in chunks of any size."""

    def __init__(self, default_stream: str, rank_workers: Sequence[int], max_chars: int):
        self.default_stream = default_stream
        self.rank_workers = rank_workers
        self.max_chars = max_chars
        # The rank and stream of the piece being read on the current physical line (None: mpirun's own).
        self.current: tuple[int, str] | None = None
        self.pending: dict[tuple[int, str] | None, str] = {}
        self.carry = ""
        self.sources: dict[str, tuple[int, str, int] | None] = {}

    def snapshot(self) -> "ReaderState":
        """What this reader holds between two chunks, so that another process can go on from here."""
        return {
            "carry": self.carry,
            "current": list(self.current) if self.current else None,
            "pending": [[key[0] if key else None, key[1] if key else None, text] for key, text in self.pending.items()],
        }

    def restore(self, state: "ReaderState") -> None:
        self.carry = state.get("carry", "")
        current = state.get("current")
        self.current = (int(current[0]), str(current[1])) if current else None
        self.pending = {
            (None if rank is None else (int(rank), str(stream))): str(text)
            for rank, stream, text in state.get("pending", [])
        }

    def feed(self, chunk: str) -> list[LogRecord]:
        at = timezone.now()  # one reading per chunk: its lines arrived together
        physical_lines = (self.carry + chunk).split("\n")
        unfinished = physical_lines.pop()
        records: list[LogRecord] = []
        for line in physical_lines:
            self._read(line, at, records, ends=True)
        bracket = unfinished.rfind("[")
        if bracket != -1 and len(unfinished) - bracket < LONGEST_TAG and TAG_START.fullmatch(unfinished, bracket):
            unfinished, self.carry = unfinished[:bracket], unfinished[bracket:]
        else:
            self.carry = ""
        self._read(unfinished, at, records, ends=False)
        return records

    def finish(self) -> list[LogRecord]:
        """The lines that never got their newline (the program ended, or was ended, mid-line)."""
        at = timezone.now()
        records: list[LogRecord] = []
        self._read(self.carry, at, records, ends=False)
        self.carry = ""
        return records + [self._complete(key, at) for key in list(self.pending)]

    def _read(self, line: str, at: datetime, records: list[LogRecord], ends: bool) -> None:
        if ends and self.current is None and not self.pending:
            # The usual case, one whole line of one rank: no piece of it is held, no other tag follows (every
            # tag holds "]<std"). What _append and _complete would do, without a pending entry a line.
            tag = TAG.match(line)
            if tag is not None and line.find("]<std", tag.end()) < 0:
                source = self._source(line, tag)
                text = line[tag.end():]
                if len(text) > self.max_chars:
                    text = text[: self.max_chars] + CUT_MARK
                text = text.rstrip("\r")
                if source is None:
                    records.append(LogRecord(text, self.default_stream, None, 0, at))
                else:
                    records.append(LogRecord(text, source[1], source[0], source[2], at))
                return
        position = 0
        for tag in TAG.finditer(line):
            self._append(line[position:tag.start()])
            self.current = self._key(tag)
            position = tag.end()
        self._append(line[position:])
        if ends:
            records.append(self._complete(self.current, at))
            self.current = None

    def _source(self, line: str, tag: re.Match) -> tuple[int, str, int] | None:
        """The rank, stream and worker a tag names (None: mpirun's own), looked up by the tag's text: a
        job's tags are few (its ranks, two streams), and this is asked of every line."""
        text = line[: tag.end()]
        if text in self.sources:
            return self.sources[text]
        key = self._key(tag)
        source = None if key is None else (key[0], key[1], worker_of_rank(self.rank_workers, key[0]))
        if len(self.sources) < MAX_SOURCES:
            self.sources[text] = source
        return source

    def _key(self, tag: re.Match) -> tuple[int, str] | None:
        # A tag naming a rank the job does not have is a program's own text that looks like one: kept as
        # mpirun's (so a forged tag can neither grow the pending lines nor store a rank out of range).
        rank = int(tag.group(2)) if len(tag.group(2)) < 7 else -1
        if not 0 <= rank < len(self.rank_workers):
            return None
        return rank, LogStream.STDOUT if tag.group(3) == "stdout" else LogStream.STDERR

    def _append(self, text: str) -> None:
        if not text:
            return
        held = self.pending.get(self.current, "")
        # Past the limit only once cut (the mark added): the rest of the line, up to its newline, is dropped. A
        # line whose pieces fill it to the limit exactly is cut (and marked) by the next piece that comes.
        if len(held) > self.max_chars:
            return
        if len(held) + len(text) > self.max_chars:
            text = text[: self.max_chars - len(held)] + CUT_MARK
        self.pending[self.current] = held + text

    def _complete(self, key: tuple[int, str] | None, at: datetime) -> LogRecord:
        text = self.pending.pop(key, "").rstrip("\r")
        if key is None:
            return LogRecord(text=text, stream=self.default_stream, worker_index=0, at=at)
        rank, stream = key
        return LogRecord(text=text, stream=stream, rank=rank, worker_index=worker_of_rank(self.rank_workers, rank), at=at)
