"""What a Slurm job's state and reason mean for the console's job, in the words its owner reads.

Slurm says PENDING with a reason code (Priority, Resources, AssocGrpCpuLimit...), then RUNNING, then one of
its end states. The console keeps its own states (Queuing, Running, Completed, Failed, Terminated...); this
module only translates, from plain values, so the run, the pages and the tests read one table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.utils.translation import gettext as _


class Phase(enum.Enum):
    WAITING = "waiting"          # pending, or requeued and pending again
    RUNNING = "running"
    COMPLETED = "completed"      # the batch script exited 0
    FAILED = "failed"            # it exited non-zero, ran out of memory, or could not start
    TIME_LIMIT = "time_limit"    # the job's --time ran out: the console's auto stop
    NODE_LOST = "node_lost"      # NODE_FAIL: a node was lost; the console's auto restart applies
    PREEMPTED = "preempted"      # requeued for a higher-priority job: the next attempt, never the job's failure
    CANCELLED = "cancelled"      # scancel, by the console's stop or by someone else


WAITING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "RESIZING", "STOPPED"})
END_STATES: dict[str, Phase] = {
    "COMPLETED": Phase.COMPLETED,
    "FAILED": Phase.FAILED,
    "OUT_OF_MEMORY": Phase.FAILED,
    "BOOT_FAIL": Phase.FAILED,
    "DEADLINE": Phase.FAILED,
    "SPECIAL_EXIT": Phase.FAILED,
    "TIMEOUT": Phase.TIME_LIMIT,
    "NODE_FAIL": Phase.NODE_LOST,
    "PREEMPTED": Phase.PREEMPTED,
    "CANCELLED": Phase.CANCELLED,
}


def phase_of(job_state: str) -> Phase:
    """The phase of a Slurm state; a state this table does not know (a later release's) counts as running
    while Slurm still holds the job, so that nothing is ended on a word the console cannot read."""
    state = job_state.split()[0].upper() if job_state.strip() else ""
    if state in WAITING_STATES:
        return Phase.WAITING
    return END_STATES.get(state, Phase.RUNNING)


def _reasons() -> dict[str, str]:
    # Looked up at call time: the words are in the language of whoever reads them.
    return {
        "Priority": _("waiting for higher-priority jobs"),
        "Resources": _("waiting for nodes to become free"),
        "Dependency": _("waiting for the jobs it depends on"),
        "BeginTime": _("waiting for its start time"),
        "ReqNodeNotAvail": _("the nodes it needs are not available (down, drained or reserved)"),
        "PartitionDown": _("the partition is down"),
        "PartitionNodeLimit": _("it asks for more nodes than the partition allows"),
        "PartitionTimeLimit": _("its time limit is longer than the partition allows"),
        "JobHeldUser": _("held by its owner"),
        "JobHeldAdmin": _("held by an administrator"),
        "launch failed requeued held": _("its launch failed and Slurm held it"),
        "BadConstraints": _("no node can ever satisfy what it asks for"),
        "Reservation": _("waiting for its reservation to start"),
        "NodeDown": _("a node it needs is down"),
        "Licenses": _("waiting for licences"),
        "Prolog": _("its nodes are running their prolog"),
    }


# Slurm's limit reasons are built from a scope and a resource: AssocGrpCpuLimit, QOSMaxJobsPerUserLimit...
_SCOPES = {"AssocGrp": "account", "AssocMax": "account", "QOSGrp": "QOS", "QOSMax": "QOS"}


def _scope_words(scope: str) -> str:
    if scope == "account":
        return _("your account's quota")
    return _("the QOS's quota")


def reason_words(reason: str | None, description: str | None = None) -> str:
    """Why a job waits, in words, with Slurm's own code kept beside them (an admin searches for it)."""
    code = (reason or "").strip()
    if not code or code == "None":
        return _("waiting for Slurm to schedule it")
    known = _reasons().get(code)
    if known:
        return f"{known} ({code})"
    for prefix, scope in _SCOPES.items():
        if code.startswith(prefix) and code.endswith("Limit"):
            resource = code[len(prefix):-len("Limit")] or code
            return _("%(quota)s is in use: %(resource)s (%(code)s)") % {
                "quota": _scope_words(scope), "resource": resource, "code": code}
    return f"{description} ({code})" if description else _("waiting: %(code)s") % {"code": code}


@dataclass(frozen=True)
class ExitStatus:
    code: int | None
    signal: int | None


def exit_status(raw: int | None) -> ExitStatus:
    """slurmctld's exit_code is a wait status: the exit code in its high byte, a signal in its low bits."""
    if raw is None:
        return ExitStatus(None, None)
    signal = raw & 0x7F
    return ExitStatus(None, signal) if signal else ExitStatus((raw >> 8) & 0xFF, None)


def allocated_nodes(record: Mapping[str, Any]) -> list[str]:
    """The names of the nodes Slurm gave a running job, in Slurm's order (its job_resources)."""
    resources = record.get("job_resources") or {}
    return [str(node["nodename"]) for node in resources.get("allocated_nodes") or [] if node.get("nodename")]


def time_limit_ends_at(start_time: int | None, time_limit_minutes: int | None) -> float | None:
    """When a running Slurm job's time limit runs out (seconds since the epoch, slurmctld's clock), from its
    record's start_time and time_limit; None without a limit."""
    start, minutes = int(start_time or 0), int(time_limit_minutes or 0)
    # v0.0.38 says "no limit" as INFINITE (0xffffffff) or NO_VAL (0xfffffffe) minutes.
    return start + minutes * 60 if start > 0 and 0 < minutes < 0xFFFFFFFE else None


def time_limit_near(limit_ends_at: float | None, notice_seconds: int, now: float) -> bool:
    """Whether a job's time limit is close enough for its notice: the console then stops it as an auto stop,
    its ranks given their grace, before Slurm kills it at the limit."""
    return limit_ends_at is not None and limit_ends_at - now <= notice_seconds


def preemption_ends_at(record: Mapping[str, Any]) -> float | None:
    """When Slurm takes a running job's nodes back for a preemption it has begun (seconds since the epoch,
    slurmctld's clock): the end of the grace its QOS or partition gives (GraceTime); None when no preemption
    is under way. With no grace Slurm requeues at once, and the job is never seen in this state."""
    if not int(record.get("preempt_time") or 0) or str(record.get("job_state") or "").split()[:1] != ["RUNNING"]:
        return None
    return float(int(record.get("end_time") or 0))
