"""How a job's ranks ended, and the "why it failed" card.

mpirun reports only the first failure, in its own words. Each rank's own end comes from the fork
agent (node_scripts/rank-agent.sh), which records it in the container; the teardown prints those
records and parse_rank_records reads them. explain_failure then puts mpirun's words, the records
and the failing rank's last lines together into one card. Everything above the database section
at the end of this module is pure.
"""

import re
import signal as signals
from dataclasses import dataclass, field
from datetime import datetime, timezone as dt_timezone

# How many of the failing rank's last lines the card shows.
LAST_LINES_SHOWN = 12
NCCL_ERROR = re.compile(
    r"NCCL WARN|NCCL error|\bnccl(?:SystemError|InternalError|UnhandledCudaError|RemoteError|InvalidUsage|InvalidArgument)\b"
)
TRACEBACK_START = "Traceback (most recent call last):"


# Rank records, as the teardown prints them.

@dataclass(frozen=True)
class RankRecord:
    rank: int
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    # A signal the rank was sent before it ended: mpirun ending the other ranks, or a stop.
    stop_signal: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.signal) or (self.exit_code is not None and self.exit_code != 0)

    @property
    def failed_by_itself(self) -> bool:
        return self.failed and not self.stop_signal


RECORD_LINE = re.compile(r"^rank-record rank=(\d+) ended=(\d+(?:\.\d+)?)?(?P<rest>.*)$")
RECORD_TOKEN = re.compile(r"\b(exit|signal|stop)=([A-Z0-9]{1,8})\b")


def parse_rank_records(output: str) -> list[RankRecord]:
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
        return "segfault", "exit code 139: a segmentation fault, often a library conflict"
    if exit_code == 127:
        return "not_found", "exit code 127: the program or its interpreter was not found"
    if exit_code == 126:
        return "not_found", "exit code 126: the program could not be executed"
    return "exit_code", f"exit code {exit_code}"


# mpirun's own words.

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


# What a rank printed.

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


def nccl_errors(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if NCCL_ERROR.search(line)]


# The card.

@dataclass
class FailureFacts:
    """Everything the card is made from, gathered by the database section below."""

    outcome: str  # how the run ended: exit (mpirun's code), failed (before launch), abnormal, stopped
    exit_code: int | None = None
    run_message: str = ""
    stop_reason: str = ""
    stop_message: str = ""
    processes_per_node: int = 1
    rank_count: int = 0
    nodes: dict[int, str] = field(default_factory=dict)  # worker index -> node name
    records: dict[int, RankRecord] = field(default_factory=dict)
    mpirun_lines: list[str] = field(default_factory=list)
    first_error_rank: int | None = None  # the rank of the log's first traceback or NCCL error line
    rank_tail: list[str] = field(default_factory=list)  # the failing rank's last lines
    nccl_lines: list[str] = field(default_factory=list)
    silent_ranks: list[int] = field(default_factory=list)
    lost_workers: dict[int, str] = field(default_factory=dict)  # worker index -> why it could not be reached


def first_failed_rank(report: MpirunReport, records: dict[int, RankRecord], first_error_rank: int | None) -> int | None:
    """mpirun's first failure if it names one, else the earliest rank that failed on its own, else the log's first error."""
    if report.rank is not None:
        return report.rank
    failed = [record for record in records.values() if record.failed_by_itself]
    if failed:
        return min(failed, key=lambda record: (record.ended_at or float("inf"), record.rank)).rank
    return first_error_rank


def explain_failure(facts: FailureFacts) -> dict:
    report = parse_mpirun_output(facts.mpirun_lines)
    rank = first_failed_rank(report, facts.records, facts.first_error_rank)
    card = {
        "kind": "unknown", "title": "", "rank": rank, "worker": None, "node": "", "how": "",
        "exit_code": facts.exit_code, "signal": None, "exception": "", "where": "",
        "last_lines": facts.rank_tail[-LAST_LINES_SHOWN:], "others": [], "mpirun": report.excerpt,
        "nccl": facts.nccl_lines[:5], "hints": [],
    }
    if rank is not None:
        worker = rank // max(facts.processes_per_node, 1)
        card.update(worker=worker, node=facts.nodes.get(worker, ""))
        record = facts.records.get(rank)
        exit_code = record.exit_code if record else report.exit_code
        signal = record.signal if record else report.signal
        end_kind, card["how"] = describe_end(exit_code, signal)
        card.update(exit_code=exit_code if exit_code is not None else facts.exit_code, signal=signal)
        exception = python_exception(facts.rank_tail)
        if exception:
            card["exception"], card["where"] = exception
    else:
        end_kind = ""
    card["others"] = _others(facts, rank)
    _classify(card, facts, report, end_kind)
    return card


def _classify(card: dict, facts: FailureFacts, report: MpirunReport, end_kind: str) -> None:
    who = _who(card)
    lost_worker = next(iter(facts.lost_workers), None)
    if facts.stop_reason == "auto_stop":
        card.update(kind="auto_stop", title=facts.stop_message or "Stopped by auto stop")
        card["hints"].append("The job ran past its auto stop limit; set a longer limit, or none, when creating it.")
    elif facts.stop_reason == "watchdog":
        silent = ", ".join(str(rank) for rank in facts.silent_ranks) or "?"
        card.update(kind="watchdog", title=facts.stop_message or f"Stopped by the watchdog: rank(s) {silent} printed nothing")
        card["hints"].append("A rank that prints nothing for the watchdog time is taken as hung (a deadlock, a collective "
                             "some ranks never reach, a stuck read). Print progress more often, or set a longer watchdog time.")
    elif report.kind == "daemon_lost" or lost_worker is not None:
        node = report.node or facts.nodes.get(lost_worker, "") if lost_worker is not None else report.node
        card.update(kind="node_lost", title=f"A node was lost mid-job{': ' + node if node else ''}")
        if lost_worker is not None:
            card["hints"].append(f"worker-{lost_worker}: {facts.lost_workers[lost_worker]}")
        card["hints"].append("The node stopped answering (rebooted, lost its network, or ran out of memory). "
                             "It is kept out of service until it is checked.")
    elif report.kind in ("daemon_failed", "daemon_start", "unreachable"):
        where = f" on {report.node}" if report.node else ""
        card.update(kind="mpirun_launch", title=f"mpirun could not start or reach its daemon{where}")
        card["hints"].append("mpirun reaches the other workers over SSH on the job's port: check that every worker's "
                             "container started and that the nodes can reach each other.")
    elif report.kind == "slots":
        card.update(kind="mpirun_slots", title="mpirun found not enough slots for the processes asked for")
        card["hints"].append("OPENMPI_EXTRA_ARGS may ask for more processes per node than the hostfile gives.")
    elif report.kind in ("not_executable", "not_found") or end_kind == "not_found":
        card.update(kind="mpirun_executable", title=f"The program could not be started{' on ' + who if who else ''}")
        card["hints"].append("The engine's interpreter must exist and be readable by the job's user on every node.")
    elif facts.outcome == "failed" and card["rank"] is None:
        card.update(kind="preparation", title=facts.run_message or "The job failed before its processes started")
    elif facts.nccl_lines and (card["rank"] is None or nccl_errors(facts.rank_tail) or card["exception"]):
        card.update(kind="nccl", title=f"NCCL failed{' in ' + who if who else ''}: {facts.nccl_lines[0][:200]}")
        card["hints"].append("The NCCL panel shows what NCCL found (interfaces, transports, the first warning).")
    elif end_kind == "oom":
        card.update(kind="oom", title=f"{who} was killed, most likely for running out of memory")
        card["hints"].append("Exit code 137 (or SIGKILL) usually means the out-of-memory killer: use less memory per "
                             "process or fewer processes per node.")
    elif end_kind == "segfault":
        card.update(kind="segfault", title=f"{who} crashed with a segmentation fault")
        card["hints"].append("Exit code 139 often comes from a library conflict (CUDA, NCCL or MPI libraries of "
                             "different versions).")
    elif card["exception"]:
        card.update(kind="exception", title=f"{who} raised {card['exception'][:200]}")
    elif end_kind == "signal":
        card.update(kind="signal", title=f"{who} was {card['how']}")
    elif end_kind == "exit_code":
        card.update(kind="exit_code", title=f"{who} exited with {card['how']}")
    elif facts.outcome == "abnormal":
        card.update(kind="abnormal", title=facts.run_message or "The run ended abnormally")
    else:
        code = facts.exit_code
        card["title"] = f"mpirun ended with exit code {code}" if code is not None else (facts.run_message or "The job failed")
    if report.kind == "improper_exit":
        card["hints"].append("mpirun saw a rank exit without calling MPI finalize: every rank must reach the end together.")


def _who(card: dict) -> str:
    if card["rank"] is None:
        return ""
    node = f", {card['node']}" if card["node"] else ""
    return f"Rank {card['rank']} (worker-{card['worker']}{node})"


def _others(facts: FailureFacts, failed_rank: int | None) -> list[dict]:
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
    return [{"what": what, "ranks": ranks} for what, ranks in groups.items()]


def describe_outcome(outcome) -> str:
    """A RankOutcome (or anything with exit_code, signal and stop_signal) in words, for the per-rank table."""
    words = describe_end(outcome.exit_code, outcome.signal)[1]
    if outcome.stop_signal:
        return f"{words}, after SIG{outcome.stop_signal} was sent to it"
    return words


# The database: record the ranks' ends and the card.

def record_rank_records(job_id: int, records: list[RankRecord]) -> None:
    from .models import RankOutcome, TrainingJob

    if not records:
        return
    job = TrainingJob.objects.select_related("spec").get(pk=job_id)
    per_node = max(job.spec.processes_per_node, 1)
    nodes = dict(job.workers.values_list("index", "node_name"))
    for record in records:
        worker = record.rank // per_node
        RankOutcome.objects.update_or_create(
            job_id=job_id,
            rank=record.rank,
            defaults={
                "worker_index": worker,
                "node_name": nodes.get(worker, ""),
                "exit_code": record.exit_code,
                "signal": record.signal,
                "stop_signal": record.stop_signal,
                "ended_at": datetime.fromtimestamp(record.ended_at, dt_timezone.utc) if record.ended_at else None,
            },
        )


def gather_failure_facts(job_id: int, outcome: str, exit_code: int | None, run_message: str,
                         lost_workers: dict[int, str]) -> FailureFacts:
    from .models import LogLine, LogStream, TrainingJob

    job = TrainingJob.objects.select_related("spec").get(pk=job_id)
    lines = LogLine.objects.filter(job_id=job_id)
    records = {
        row.rank: RankRecord(rank=row.rank, ended_at=row.ended_at.timestamp() if row.ended_at else None,
                             exit_code=row.exit_code, signal=row.signal, stop_signal=row.stop_signal)
        for row in job.rank_outcomes.all()
    }
    # mpirun's error blocks come last; its untagged lines are few next to the ranks'.
    mpirun_lines = [text for text in lines.filter(rank__isnull=True).exclude(stream=LogStream.SYSTEM)
                    .order_by("-seq").values_list("text", flat=True)[:400]][::-1]
    first_error = (lines.filter(rank__isnull=False)
                   .filter(text__contains=TRACEBACK_START).order_by("seq").values_list("rank", flat=True).first())
    nccl = [text for text in lines.filter(text__contains="NCCL").order_by("seq").values_list("text", flat=True)[:2000]
            if NCCL_ERROR.search(text)]
    facts = FailureFacts(
        outcome=outcome, exit_code=exit_code, run_message=run_message, stop_reason=job.stop_reason,
        stop_message=job.status_message if job.stop_reason else "",
        processes_per_node=job.spec.processes_per_node, rank_count=job.spec.processes_per_node * job.node_count,
        nodes=dict(job.workers.values_list("index", "node_name")),
        records=records, mpirun_lines=mpirun_lines, first_error_rank=first_error, nccl_lines=nccl,
        silent_ranks=[item["rank"] for item in job.silent_ranks], lost_workers=lost_workers,
    )
    rank = first_failed_rank(parse_mpirun_output(mpirun_lines), records, first_error)
    if rank is not None:
        facts.rank_tail = [text for text in lines.filter(rank=rank).order_by("-seq").values_list("text", flat=True)[:200]][::-1]
    return facts


def record_failure(job_id: int, outcome: str, exit_code: int | None, run_message: str,
                   lost_workers: dict[int, str]) -> dict:
    """Build and keep the card of a job that did not end well; returns it ({} for a job that did)."""
    from .models import JobStatus, TrainingJob

    job = TrainingJob.objects.get(pk=job_id)
    stopped_by_user = outcome == "stopped" or (job.status == JobStatus.TERMINATING and not job.stop_reason)
    if stopped_by_user or (outcome == "exit" and exit_code == 0):
        return {}
    card = explain_failure(gather_failure_facts(job_id, outcome, exit_code, run_message, lost_workers))
    TrainingJob.objects.filter(pk=job_id).update(failure=card)
    return card
