"""The problems half of the NCCL log collector: WARN lines, the "file:line -> N"
backtraces that follow them, and NCCL error text printed by the program
(PyTorch, Horovod, OneFlow exceptions).

The collector in `nccl.parser` owns one `ProblemFacts`.  The one fact it
shares with the network half (a "no socket interface found" in a warning or
an error) is handed over through the `note_text` callable given to it, so the
class reads on its own.  No Django imports.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from . import patterns as P

MAX_STORED = 200  # warnings and distinct errors kept; the rest are counted
MAX_TRACKED = 10_000  # processes, comm handles, threads: a cap against absurd input


class ProblemFacts:
    """Warnings, errors and result codes, line by line.

    `note_text` is called with the text of every warning and error (and the
    detail after "Last error:"): the network half looks there for "no socket
    interface found".
    """

    def __init__(self, note_text: Callable[[str], None]) -> None:
        self.note_text = note_text
        self.warning_records: list[dict] = []
        self.warnings_total = 0
        self.errors: dict[tuple, dict] = {}
        self.errors_omitted = 0
        self.error_codes: Counter[str] = Counter()
        self.failed_threads: set[tuple] = set()
        self.last_warn_by_thread: dict[tuple, str] = {}
        self.duplicate_gpus: list[dict] = []
        self.error_context_lines = 0
        self.awaiting_error_detail = False

    def add_error(self, key: tuple, text: str, process: tuple | None = None) -> None:
        entry = self.errors.get(key)
        if entry is None:
            if len(self.errors) >= MAX_STORED:
                self.errors_omitted += 1
                return
            entry = self.errors[key] = {"text": text, "count": 0, "processes": set()}
        entry["count"] += 1
        if process is not None and len(entry["processes"]) < MAX_TRACKED:
            entry["processes"].add(process)

    # -- errors printed by the program --------------------------------------
    def on_error_text(self, line: str) -> None:
        text = line.strip()[:300]
        self.add_error(("text", text), text)
        self.note_text(text)
        self.error_context_lines = 3

    def follow_error_context(self, line: str) -> bool:
        """PyTorch prints "Last error:" and the cause on the following line."""
        text = line.strip()
        if self.awaiting_error_detail:
            if text:
                self.add_error(("text", "Last error: " + text[:280]), "Last error: " + text[:280])
                self.note_text(text)
                self.awaiting_error_detail = False
                self.error_context_lines = 0
            return True
        if text.startswith("Last error:"):
            detail = text[len("Last error:") :].strip()
            if detail:
                self.add_error(("text", text[:300]), text[:300])
                self.note_text(detail)
                self.error_context_lines = 0
            else:
                self.awaiting_error_detail = True
            return True
        if "NCCL" not in line and P.ERROR_TEXT.search(line):
            self.on_error_text(line)
            return True
        self.error_context_lines -= 1
        return False

    # -- warnings and backtraces ---------------------------------------------
    def on_warn(
        self, slot: tuple, tid: str, source: str | None, message: str, prefix: str, launcher_rank: int | None = None
    ) -> None:
        """`launcher_rank` is the rank the launcher stored the line under; without it, the
        mpirun tag in the line's `prefix` (if any) names it."""
        kind, fatal = P.classify_warning(source, message)
        self.warnings_total += 1
        if launcher_rank is None:
            tag = P.MPIRUN_TAG.search(prefix)  # "[1,23]<stdout>:" names the launcher's rank
            launcher_rank = int(tag.group(2)) if tag else None
        if len(self.warning_records) < MAX_STORED:
            self.warning_records.append(
                {
                    "host": slot[0],
                    "pid": slot[1],
                    "cuda_dev": slot[2],
                    "source": source,
                    "message": message[:500],
                    "kind": kind,
                    "fatal": fatal,
                    "launcher_rank": launcher_rank,
                }
            )
        thread = (slot[0], slot[1], tid)
        if len(self.last_warn_by_thread) >= MAX_TRACKED:
            self.last_warn_by_thread.clear()
        self.last_warn_by_thread[thread] = message[:200]
        duplicate = P.DUPLICATE_GPU.search(message)
        if duplicate and len(self.duplicate_gpus) < MAX_STORED:
            self.duplicate_gpus.append(
                {
                    "ranks": [int(duplicate.group(1)), int(duplicate.group(2))],
                    "bus_id": P.normalise_bus_id(duplicate.group(3)),
                    "host": slot[0],
                }
            )
        self.note_text(message)
        if fatal:
            where = f" [{source}]" if source else ""
            self.add_error(("warn", message[:200]), f"{message[:300]}{where}", slot[:2])

    def on_backtrace(self, slot: tuple, tid: str, location: str, code: int) -> None:
        thread_code = (slot[0], slot[1], tid, code)
        if thread_code in self.failed_threads:
            return
        if len(self.failed_threads) < MAX_TRACKED:
            self.failed_threads.add(thread_code)
        name, meaning = P.NCCL_RESULTS.get(code, (f"ncclResult {code}", "unknown result code"))
        self.error_codes[name] += 1
        cause = self.last_warn_by_thread.get((*slot[:2], tid))
        text = f"{name}: {meaning} (first returned at {location} on {slot[0]} pid {slot[1]} dev {slot[2]}"
        text += f", after WARN '{cause}')" if cause else ")"
        self.add_error(("code", code), text, slot[:2])
