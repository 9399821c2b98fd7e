"""The "why it failed" card: mpirun's words, each rank's record and the failing rank's last lines, together.

mpirun reports only the first failure, in its own words; the fork agent's records say how every
rank ended. explain_failure picks the rank that failed first and reads the card's kind off an
ordered table of rules (the first that applies wins). Pure: recording.py gathers the facts.
"""

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from jobs.launch.command_builder import McaSetting, mca_settings
from jobs.launch.plan import worker_of_rank
from jobs.results.mpirun_report import MpirunReport, mentions, openmpi_messages, parse_mpirun_output
from jobs.results.rank_records import SEGFAULT_GUESS, RankRecord, describe_end

# How many of the failing rank's last lines the card shows.
LAST_LINES_SHOWN = 12
NCCL_ERROR = re.compile(
    r"NCCL WARN|NCCL error|\bnccl(?:SystemError|InternalError|UnhandledCudaError|RemoteError|InvalidUsage|InvalidArgument)\b"
)
TRACEBACK_START = "Traceback (most recent call last):"
# How the worker watch says it ended a worker for its disk (jobs.runtime.liveness); the card's rule reads it.
DISK_LIMIT_REASON = "it passed its disk limit"


def python_exception(lines: list[str]) -> tuple[str, str] | None:
    """The exception the last traceback in these lines ends with, and its innermost frame."""
    starts = [index for index, line in enumerate(lines) if TRACEBACK_START in line]
    if not starts:
        return None
    frame = ""
    for line in lines[starts[-1] + 1:]:
        if line.startswith((" ", "\t")):
            if line.strip().startswith("File "):
                frame = line.strip()
            continue
        if line.strip():
            return line.strip(), frame
    return None


# Exceptions of the console's own (SSH, sockets) as people would say them; any other keeps its name.
PLAIN_EXCEPTIONS = {
    "ConnectionLost": "the connection to the node was lost",
    "ConnectionResetError": "the node reset the connection",
    "ConnectionRefusedError": "the node refused the connection",
    "BrokenPipeError": "the connection to the node broke",
    "TimeoutError": "the node did not answer in time",
    "DisconnectError": "the node closed the connection",
    "PermissionDenied": "the node refused the console's key",
    "HostKeyNotVerifiable": "the node's host key did not match",
    "OSError": "a network error",
}
EXCEPTION_REPR = re.compile(r"\b(?:[a-z_][\w.]*\.)?([A-Z]\w*)\((?:(['\"])(.*?)\2(?:,[^)]*)?)?\)")


def plain_words(text: str) -> str:
    """The text with Python reprs of exceptions (`ConnectionLost('Connection lost')`) said in plain words,
    the exception's own message kept: a card is read by people, not by the program that raised."""

    def said(match: re.Match) -> str:
        name, message = match.group(1), (match.group(3) or "").strip()
        words = PLAIN_EXCEPTIONS.get(name)
        if words is None:
            return f"{name}: {message}" if message else name
        return f"{words} ({message})" if message and message.lower() not in words else words

    return EXCEPTION_REPR.sub(said, text)


def nccl_errors(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if NCCL_ERROR.search(line)]


# The card.

class OtherRanks(TypedDict):
    what: str
    ranks: list[int]


class FailureCard(TypedDict):
    """The card as the job page and the API show it (kept in TrainingJob.failure)."""

    kind: str
    title: str
    rank: int | None
    worker: int | None
    node: str
    how: str
    exit_code: int | None
    signal: int | None
    exception: str
    where: str
    last_lines: list[str]
    others: list[OtherRanks]
    mpirun: str
    nccl: list[str]
    hints: list[str]
    # Open MPI's warnings (and what it said of the job's own MCA settings), each message as it printed it.
    openmpi: list[str]


@dataclass
class FailureFacts:
    """Everything the card is made from, gathered by recording.py."""

    outcome: str  # how the run ended: a RunOutcome (exit, failed, abnormal, stopped)
    exit_code: int | None = None
    run_message: str = ""
    stop_reason: str = ""
    stop_message: str = ""
    # The worker of each rank, by rank (the plan's rank_workers).
    rank_workers: Sequence[int] = ()
    nodes: dict[int, str] = field(default_factory=dict)  # worker index -> node name
    records: dict[int, RankRecord] = field(default_factory=dict)
    mpirun_lines: list[str] = field(default_factory=list)
    mpirun_opening: list[str] = field(default_factory=list)  # mpirun's first lines: where Open MPI warns
    extra_args: str = ""  # the job's OPENMPI_EXTRA_ARGS
    first_error_rank: int | None = None  # the rank of the log's first traceback or NCCL error line
    rank_tail: list[str] = field(default_factory=list)  # the failing rank's last lines
    nccl_lines: list[str] = field(default_factory=list)
    silent_ranks: list[int] = field(default_factory=list)
    lost_workers: dict[int, str] = field(default_factory=dict)  # worker index -> why it could not be reached

    @property
    def rank_count(self) -> int:
        return len(self.rank_workers)


def first_failed_rank(report: MpirunReport, records: dict[int, RankRecord], first_error_rank: int | None) -> int | None:
    """mpirun's first failure if it names one, else the earliest rank that failed on its own, else the log's first error."""
    if report.rank is not None:
        return report.rank
    failed = [record for record in records.values() if record.failed_by_itself]
    if failed:
        return min(failed, key=lambda record: (record.ended_at or float("inf"), record.rank)).rank
    return first_error_rank


def explain_failure(facts: FailureFacts) -> FailureCard:
    report = parse_mpirun_output(facts.mpirun_lines)
    rank = first_failed_rank(report, facts.records, facts.first_error_rank)
    card = FailureCard(
        kind="unknown", title="", rank=rank, worker=None, node="", how="",
        exit_code=facts.exit_code, signal=None, exception="", where="",
        last_lines=facts.rank_tail[-LAST_LINES_SHOWN:], others=[], mpirun=report.excerpt,
        nccl=facts.nccl_lines[:5], hints=[], openmpi=[],
    )
    end_kind = ""
    if rank is not None:
        record = facts.records.get(rank)
        worker = record.worker if record and record.worker is not None else worker_of_rank(facts.rank_workers, rank)
        card["worker"], card["node"] = worker, facts.nodes.get(worker, "")
        # mpirun's own word on the rank it names comes first: a rank record is written in the job's home, the
        # job's own claim, and adds only what mpirun did not say.
        if report.rank == rank and (report.exit_code is not None or report.signal is not None):
            exit_code, signal = report.exit_code, report.signal
        else:
            exit_code = record.exit_code if record else report.exit_code
            signal = record.signal if record else report.signal
        end_kind, card["how"] = describe_end(exit_code, signal)
        card["exit_code"] = exit_code if exit_code is not None else facts.exit_code
        card["signal"] = signal
        exception = python_exception(facts.rank_tail)
        if exception:
            card["exception"], card["where"] = exception
    card["others"] = _others(facts, rank)
    settings = mca_settings(facts.extra_args)
    card["openmpi"] = openmpi_messages(facts.mpirun_opening, _words_of(settings))
    blamed = [setting for setting in settings
              if any(mentions(message, word) for message in card["openmpi"] for word in _words_of([setting]))]
    _classify(card, CardContext(facts, report, end_kind, _who(card), blamed))
    return card


# A value this short (a 1, an on) says nothing of which setting a message is about.
MIN_VALUE_MENTIONED = 3


def _words_of(settings: list[McaSetting]) -> tuple[str, ...]:
    """What Open MPI would name in a message about these settings: the parameters, and their values."""
    words = [setting.name for setting in settings]
    words += [setting.value for setting in settings if len(setting.value) >= MIN_VALUE_MENTIONED]
    words += [entry for setting in settings for entry in setting.value.split(",") if len(entry) >= MIN_VALUE_MENTIONED]
    return tuple(dict.fromkeys(words))


@dataclass(frozen=True)
class CardContext:
    facts: FailureFacts
    report: MpirunReport
    end_kind: str  # describe_end's kind for the failing rank, "" without one
    who: str  # "Rank 3 (worker-1, node-b)", "" without a failing rank
    # The job's own MCA settings (OPENMPI_EXTRA_ARGS) that Open MPI's messages name.
    blamed: list[McaSetting] = field(default_factory=list)

    @property
    def lost_worker(self) -> int | None:
        return next(iter(self.facts.lost_workers), None)


@dataclass(frozen=True)
class Rule:
    kind: str
    applies: Callable[[CardContext, FailureCard], bool]
    title: Callable[[CardContext, FailureCard], str]
    hints: Callable[[CardContext], list[str]] = lambda context: []


def _lost_node(context: CardContext) -> str:
    lost = context.lost_worker
    if lost is None:
        return context.report.node
    # The console knows which node it lost; mpirun's report names only the container's host name.
    return context.facts.nodes.get(lost, "") or context.report.node


def _lost_hints(context: CardContext) -> list[str]:
    lost = context.lost_worker
    first = [f"worker-{lost}: {plain_words(context.facts.lost_workers[lost])}"] if lost is not None else []
    return first + ["The node stopped answering (rebooted, lost its network, or ran out of memory). "
                    "It is kept out of service until it is checked."]


def _disk_worker(context: CardContext) -> int | None:
    return next((index for index, why in sorted(context.facts.lost_workers.items()) if DISK_LIMIT_REASON in why), None)


def _disk_title(context: CardContext) -> str:
    index = _disk_worker(context)
    node = context.facts.nodes.get(index, "") if index is not None else ""
    where = f" on {node}" if node else ""
    return f"worker-{index}{where} was stopped at its disk limit"


def _disk_hints(context: CardContext) -> list[str]:
    index = _disk_worker(context)
    why = context.facts.lost_workers.get(index, "") if index is not None else ""
    return ([f"worker-{index}: {why}"] if why else []) + [
        "The spec's disk limit counts what the job writes to its home and inside its container (/tmp included); "
        "write large outputs to shared storage, or ask for a spec with a larger disk."]


def _blames_extra_args(context: CardContext, card: FailureCard) -> bool:
    """Open MPI spoke of a setting of OPENMPI_EXTRA_ARGS, and nothing else explains the failure better: it
    warns and goes on without the setting (an unknown interface: no TCP between the nodes), and the ranks then
    crash, abort or cannot start, in ways that do not say why. A rank that ran out of memory, could not be found
    or raised an exception of its own (not MPI's) failed for its own reasons."""
    if not context.blamed or context.end_kind in ("oom", "not_found"):
        return False
    return not card["exception"] or "MPI" in card["exception"]


def _extra_args_title(context: CardContext) -> str:
    if context.who:
        return f"{context.who} failed after Open MPI warned about OPENMPI_EXTRA_ARGS"
    return "mpirun failed after Open MPI warned about OPENMPI_EXTRA_ARGS"


def _extra_args_hints(context: CardContext) -> list[str]:
    return [f"Open MPI's words above are about {setting.given}, given in OPENMPI_EXTRA_ARGS: the likely cause. "
            "Correct it or leave it out, then rebuild the job." for setting in context.blamed]


def _silent(context: CardContext) -> str:
    return ", ".join(str(rank) for rank in context.facts.silent_ranks) or "?"


def _on(who: str) -> str:
    return f" on {who}" if who else ""


# In order: the first rule that applies names the card. A stop by the console explains everything
# after it; a lost node explains the ranks' deaths that follow; launch trouble comes before any rank's.
RULES: tuple[Rule, ...] = (
    Rule("auto_stop", lambda c, card: c.facts.stop_reason == "auto_stop",
         lambda c, card: c.facts.stop_message or "Stopped by auto stop",
         lambda c: ["The job ran past its auto stop limit; set a longer limit, or none, when creating it."]),
    Rule("watchdog", lambda c, card: c.facts.stop_reason == "watchdog",
         lambda c, card: c.facts.stop_message or f"Stopped by the watchdog: rank(s) {_silent(c)} printed nothing",
         lambda c: ["A rank that prints nothing for the watchdog time is taken as hung (a deadlock, a collective "
                    "some ranks never reach, a stuck read). Print progress more often, or set a longer watchdog time."]),
    # Before a lost node: the watch ended the worker for its disk, and mpirun then lost its daemon there.
    Rule("disk_limit", lambda c, card: _disk_worker(c) is not None, lambda c, card: _disk_title(c), _disk_hints),
    Rule("node_lost", lambda c, card: c.report.kind == "daemon_lost" or c.lost_worker is not None,
         lambda c, card: f"A node was lost mid-job{': ' + _lost_node(c) if _lost_node(c) else ''}", _lost_hints),
    # Before the launch's and the ranks' troubles: a setting Open MPI refused explains them.
    Rule("openmpi_options", _blames_extra_args, lambda c, card: _extra_args_title(c), _extra_args_hints),
    Rule("mpirun_launch", lambda c, card: c.report.kind in ("daemon_failed", "daemon_start", "unreachable"),
         lambda c, card: f"mpirun could not start or reach its daemon{_on(c.report.node)}",
         lambda c: ["mpirun reaches the other workers over SSH on the job's port: check that every worker's "
                    "container started and that the nodes can reach each other."]),
    Rule("mpirun_slots", lambda c, card: c.report.kind == "slots",
         lambda c, card: "mpirun found not enough slots for the processes asked for",
         lambda c: ["OPENMPI_EXTRA_ARGS may ask for more processes per node than the hostfile gives."]),
    Rule("mpirun_executable", lambda c, card: c.report.kind in ("not_executable", "not_found") or c.end_kind == "not_found",
         lambda c, card: f"The program could not be started{_on(c.who)}",
         lambda c: ["The engine's interpreter must exist and be readable by the job's user on every node."]),
    Rule("preparation", lambda c, card: c.facts.outcome == "failed" and card["rank"] is None,
         lambda c, card: plain_words(c.facts.run_message) or "The job failed before its processes started"),
    Rule("nccl", lambda c, card: bool(c.facts.nccl_lines) and (card["rank"] is None or bool(nccl_errors(c.facts.rank_tail))
                                                                or bool(card["exception"])),
         lambda c, card: f"NCCL failed{' in ' + c.who if c.who else ''}: {c.facts.nccl_lines[0][:200]}",
         lambda c: ["The NCCL panel shows what NCCL found (interfaces, transports, the first warning)."]),
    Rule("oom", lambda c, card: c.end_kind == "oom",
         lambda c, card: f"{c.who} was killed, most likely for running out of memory",
         lambda c: ["Exit code 137 (or SIGKILL) usually means the out-of-memory killer: use less memory per "
                    "process or fewer processes per node."]),
    Rule("segfault", lambda c, card: c.end_kind == "segfault",
         lambda c, card: f"{c.who} crashed with a segmentation fault",
         lambda c: ["Exit code 139 often comes from a library conflict (CUDA, NCCL or MPI libraries of "
                    "different versions)."]),
    Rule("exception", lambda c, card: bool(card["exception"]), lambda c, card: f"{c.who} raised {card['exception'][:200]}"),
    Rule("signal", lambda c, card: c.end_kind == "signal", lambda c, card: f"{c.who} was {card['how']}"),
    Rule("exit_code", lambda c, card: c.end_kind == "exit_code", lambda c, card: f"{c.who} exited with {card['how']}"),
    Rule("abnormal", lambda c, card: c.facts.outcome == "abnormal",
         lambda c, card: plain_words(c.facts.run_message) or "The run ended abnormally"),
)


def _fallback_title(facts: FailureFacts) -> str:
    if facts.exit_code is not None:
        return f"mpirun ended with exit code {facts.exit_code}"
    return plain_words(facts.run_message) or "The job failed"


def _classify(card: FailureCard, context: CardContext) -> None:
    rule = next((rule for rule in RULES if rule.applies(context, card)), None)
    if rule is None:
        card["title"] = _fallback_title(context.facts)
    else:
        card["kind"], card["title"] = rule.kind, rule.title(context, card)
        card["hints"].extend(rule.hints(context))
    if card["kind"] == "openmpi_options":
        # The crash has its cause: not the library conflict exit code 139 is guessed to come from.
        card["how"] = card["how"].replace(SEGFAULT_GUESS, "")
        for group in card["others"]:
            group["what"] = group["what"].replace(SEGFAULT_GUESS, "")
    elif card["openmpi"]:
        card["hints"].append("Open MPI warned before the failure (its words are quoted above): they may explain it.")
    if context.report.kind == "improper_exit":
        card["hints"].append("mpirun saw a rank exit without calling MPI finalize: every rank must reach the end together.")


def _who(card: FailureCard) -> str:
    if card["rank"] is None:
        return ""
    node = f", {card['node']}" if card["node"] else ""
    return f"Rank {card['rank']} (worker-{card['worker']}{node})"


def _others(facts: FailureFacts, failed_rank: int | None) -> list[OtherRanks]:
    """What the other ranks did, grouped: ended by mpirun, finished, failed too, hung, or no record."""
    groups: dict[str, list[int]] = {}
    silent = set(facts.silent_ranks)
    rank_count = max([facts.rank_count - 1, *facts.records, *silent]) + 1 if (facts.rank_count or facts.records) else 0
    for rank in range(rank_count):
        if rank == failed_rank:
            continue
        record = facts.records.get(rank)
        if record is None:
            what = "was silent (suspected hung), then ended with its container" if rank in silent else "left no record: ended with its container"
        elif record.stop_signal:
            by = "the stop" if facts.stop_reason or facts.outcome == "stopped" else "mpirun"
            after = f" after rank {failed_rank} failed" if failed_rank is not None and by == "mpirun" else ""
            what = f"ended by {by} (SIG{record.stop_signal}){after}"
            if rank in silent:
                what = "was silent (suspected hung), then " + what
        elif record.failed:
            what = "failed too: " + describe_end(record.exit_code, record.signal)[1]
        elif record.exit_code == 0:
            what = "finished (exit code 0)"
        else:
            what = "left no exit status: ended with its container"
        groups.setdefault(what, []).append(rank)
    return [OtherRanks(what=what, ranks=ranks) for what, ranks in groups.items()]
