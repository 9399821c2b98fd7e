"""What the job pages show of a job, secrets masked: its command, hostfile, tune file and variables."""

import re
from dataclasses import dataclass

from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from jobs.allocation import waiting_reason
from jobs.launch.command_builder import JOB_DIR
from jobs.launch.masking import ShownVariable, mask_shell_text, shown_variables, tune_file_names
from jobs.launch.plan import worker_environment_for
from jobs.models import JobStatus, TrainingJob, WorkerState
from jobs.results.recording import launched_rank_workers

# Keyed by the status's value: a JobStatus is a str, and callers pass either.
STATE_BADGES: dict[str, str] = {
    JobStatus.CREATING: "info",
    JobStatus.PENDING: "waiting",
    JobStatus.RUNNING: "running",
    JobStatus.COMPLETED: "success",
    JobStatus.FAILED: "danger",
    JobStatus.TERMINATING: "warning",
    JobStatus.TERMINATED: "muted",
    JobStatus.ABNORMAL: "danger",
}


@dataclass(frozen=True)
class JobDisplay:
    command_template: str
    command: str
    hostfile: str
    tune_file: str
    tune_variables: list[ShownVariable]
    env: list[ShownVariable]
    parameters: list[ShownVariable]
    processes: int
    worker_indexes: list[int]
    # Each rank with the worker it runs on, so that the log's Rank list follows the chosen worker.
    ranks: list[tuple[int, int]]
    working_dir: str
    waiting_reason: str
    extra_args: str


def worker0_environment(job: TrainingJob) -> dict[str, str]:
    """Worker-0's variables as the launch computed them, from the job's workers as allocated."""
    addresses = [worker.address for worker in job.workers.order_by("index")]
    if not addresses:
        return dict(job.env)
    return worker_environment_for(job.launch_values(), 0, addresses)


def rank_choices(job: TrainingJob) -> list[tuple[int, int]]:
    """(rank, worker) for each of the job's ranks, where its launch put them (or will put them)."""
    return list(enumerate(launched_rank_workers(job)))


def display(job: TrainingJob) -> JobDisplay:
    parameters = {item["name"]: item["value"] for item in job.parameters}
    processes = job.spec.processes_per_node * job.node_count
    return JobDisplay(
        command_template=mask_shell_text(job.command_template),
        command=mask_shell_text(job.command),
        hostfile=mask_shell_text(job.hostfile),
        tune_file=job.tune_file,
        tune_variables=shown_variables(tune_file_names(job.tune_file), worker0_environment(job) if job.tune_file else {}),
        env=shown_variables(job.env, job.env),
        parameters=shown_variables(parameters, parameters),
        processes=processes,
        worker_indexes=list(range(job.node_count)),
        ranks=rank_choices(job),
        working_dir=f"{JOB_DIR}/{job.code_dir.name}",
        waiting_reason=waiting_reason(job),
        extra_args=mask_shell_text(job.extra_args),
    )


def badge(status: str) -> str:
    return STATE_BADGES.get(status, "muted")


# How far a worker's preparation has gone: a bar on the job page (percent in steps the stylesheet knows).
PREPARATION_STEPS: dict[str, dict[str, object]] = {
    WorkerState.ALLOCATED: {"percent": 25, "tone": "info"},
    WorkerState.PREPARING: {"percent": 50, "tone": "info"},
    WorkerState.UPLOADING: {"percent": 75, "tone": "info"},
    WorkerState.READY: {"percent": 100, "tone": "success"},
    WorkerState.FAILED: {"percent": 100, "tone": "danger"},
    WorkerState.STOPPED: {"percent": 100, "tone": "muted"},
    WorkerState.UNCLEAN: {"percent": 100, "tone": "warning"},
}

# The console's own messages (kept in English in the database: the timeline, a job's state message), said in
# the page's language. A message not listed here is shown as it was written.
FIXED_MESSAGES = {text: text for text in (
    gettext_noop("Job created, waiting for resources"),
    gettext_noop("Nodes allocated, preparing the containers"),
    gettext_noop("Training started"),
    gettext_noop("Stop requested by the user"),
    gettext_noop("Stopped by the user while queued"),
    gettext_noop("Stopped by the user"),
    gettext_noop("Stopped by auto stop"),
    gettext_noop("Stopped by the watchdog"),
    gettext_noop("No longer suspected hung: every rank printed again"),
    gettext_noop("Stopped before its containers were started"),
)}
PATTERN_MESSAGES = (
    (re.compile(r"^Training end with return code: (?P<code>-?\d+)$"), gettext_noop("Training end with return code: %(code)s")),
    (re.compile(r"^Stop requested by (?P<user>.+)$"), gettext_noop("Stop requested by %(user)s")),
    (re.compile(r"^Restarting \(attempt (?P<attempt>\d+) of (?P<of>\d+)\): (?P<reason>.*)$", re.S),
     gettext_noop("Restarting (attempt %(attempt)s of %(of)s): %(reason)s")),
    (re.compile(r"^Suspected hung: rank\(s\) (?P<ranks>[\d, ]+) printed nothing for more than (?P<seconds>\d+) s$"),
     gettext_noop("Suspected hung: rank(s) %(ranks)s printed nothing for more than %(seconds)s s")),
    (re.compile(r"^No longer suspected hung: rank\(s\) (?P<ranks>[\d, ]+) ended$"),
     gettext_noop("No longer suspected hung: rank(s) %(ranks)s ended")),
    (re.compile(r"^Attempt (?P<failed>\d+) failed \((?P<reason>.*)\); attempt (?P<next>\d+) queued$", re.S),
     gettext_noop("Attempt %(failed)s failed (%(reason)s); attempt %(next)s queued")),
    (re.compile(r"^Force released by (?P<by>[^;]+); nodes freed for a health check: (?P<nodes>.*)$"),
     gettext_noop("Force released by %(by)s; nodes freed for a health check: %(nodes)s")),
    (re.compile(r"^Force released by (?P<by>.+)$"), gettext_noop("Force released by %(by)s")),
    # A worker's preparation (jobs/runtime/preparation.py), in its row and in the timeline.
    (re.compile(r"^preparing (?P<worker>worker-\d+) on (?P<node>.+)$"), gettext_noop("preparing %(worker)s on %(node)s")),
    (re.compile(r"^uploading code to (?P<worker>worker-\d+)$"), gettext_noop("uploading code to %(worker)s")),
    (re.compile(r"^(?P<worker>worker-\d+) container (?P<container>\S+) \((?P<host>[^)]+)\) is up, sshd on port (?P<port>\d+)$"),
     gettext_noop("%(worker)s container %(container)s (%(host)s) is up, sshd on port %(port)s")),
)


def translated_message(text: str) -> str:
    if text in FIXED_MESSAGES:
        return _(text)
    for pattern, words in PATTERN_MESSAGES:
        match = pattern.match(text)
        if match:
            return _(words) % match.groupdict()
    return text
