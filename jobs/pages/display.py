"""What the job pages show of a job, secrets masked: its command, hostfile, tune file and variables."""

import re
from dataclasses import dataclass

from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from jobs.allocation import waiting_reason
from jobs.launch.command_builder import JOB_DIR
from jobs.launch.masking import ShownVariable, mask_shell_text, shown_variables, tune_file_names
from jobs.launch.plan import worker_environment_for
from jobs.models import JobStatus, ResourceSpec, TrainingJob, WorkerState
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


def spec_words(spec: ResourceSpec) -> str:
    """A spec as ResourceSpec.display says it ("CPU: 2 cores | Memory: 4 GB"), in the page's language."""
    parts = []
    if spec.gpu_count:
        parts.append(_("GPU: %(count)s × %(model)s") % {"count": spec.gpu_count, "model": spec.gpu_model or "GPU"})
    parts.append(_("CPU: %(cores)s cores") % {"cores": spec.cpu_cores})
    parts.append(_("Memory: %(gb)s GB") % {"gb": spec.memory_gb})
    return " | ".join(parts)


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

PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def shape(words: str) -> tuple[re.Pattern[str], str]:
    """A message's English words with %(name)s placeholders, and the pattern that reads the values back out of
    a message written with them: the words are the one source of both (the pattern is not written twice)."""
    pieces = PLACEHOLDER.split(words)
    # split() alternates literal text and placeholder names; each value is the shortest text that lets the rest
    # of the message match, so a message is read the same way whatever its values hold.
    pattern = "".join(re.escape(piece) if index % 2 == 0 else f"(?P<{piece}>.+?)" for index, piece in enumerate(pieces))
    return re.compile(pattern + r"\Z", re.S), words


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
    gettext_noop("The hold ended; the nodes were freed"),
)}
PATTERN_MESSAGES = (
    shape(gettext_noop("Training end with return code: %(code)s")),
    shape(gettext_noop("Stop requested by %(user)s")),
    shape(gettext_noop("Restarting (attempt %(attempt)s of %(of)s): %(reason)s")),
    shape(gettext_noop("Suspected hung: rank(s) %(ranks)s printed nothing for more than %(seconds)s s")),
    shape(gettext_noop("No longer suspected hung: rank(s) %(ranks)s ended")),
    shape(gettext_noop("Attempt %(failed)s failed (%(reason)s); attempt %(next)s queued")),
    shape(gettext_noop("Force released by %(by)s; nodes freed for a health check: %(nodes)s")),
    shape(gettext_noop("Force released by %(by)s")),
    # Checkpoints and the notice before a stop (jobs/results/checkpoints.py, jobs/runtime/run_data.py).
    shape(gettext_noop("Checkpoint at step %(step)s (%(path)s, %(size)s) saved in the store")),
    shape(gettext_noop("Checkpoint at step %(step)s (%(path)s, %(size)s) saved %(seconds)s s after the notice")),
    shape(gettext_noop("Notice: SIG%(signal)s sent to %(count)s rank(s); up to %(grace)s s to save a checkpoint "
                       "(cut short: the nodes are taken back)")),
    shape(gettext_noop("Notice: SIG%(signal)s sent to %(count)s rank(s); up to %(grace)s s to save a checkpoint")),
    # A failed job's hold and its terminal (jobs/runtime/debug_hold.py, jobs/submission/holds.py, shell.py).
    shape(gettext_noop("Containers and nodes held for debugging until %(time)s UTC")),
    shape(gettext_noop("The hold ended early: %(worker)s %(why)s")),
    shape(gettext_noop("Released by %(user)s")),
    shape(gettext_noop("Ended early by the administrator %(user)s")),
    shape(gettext_noop("%(user)s opened a shell in %(worker)s")),
    # A worker's preparation (jobs/runtime/preparation.py), in its row and in the timeline.
    shape(gettext_noop("preparing %(worker)s on %(node)s")),
    shape(gettext_noop("uploading code to %(worker)s")),
    shape(gettext_noop("%(worker)s container %(container)s (%(host)s) is up, sshd on port %(port)s")),
    # Its data fetched before the start (jobs/runtime/data_in.py), its engine image brought (node_images.py), its
    # container removed at the end (run.py).
    shape(gettext_noop("%(what)s: fetching 1 file, %(size)s, onto %(node)s")),
    shape(gettext_noop("%(what)s: fetching %(files)s files, %(size)s, onto %(node)s")),
    shape(gettext_noop("%(what)s: %(done)s/%(files)s files, %(size)s of %(total)s, %(rate)s/s")),
    shape(gettext_noop("%(what)s ready: 1 file, %(size)s in %(seconds)s s; %(fetched)s fetched from the store, "
                       "%(cached)s from the node's cache")),
    shape(gettext_noop("%(what)s ready: %(files)s files, %(size)s in %(seconds)s s; %(fetched)s fetched from the store, "
                  "%(cached)s from the node's cache")),
    shape(gettext_noop("%(node)s has no %(image)s: pulling it")),
    shape(gettext_noop("%(node)s: %(image)s is being brought to it by another job: waiting for that")),
    shape(gettext_noop("%(node)s has no %(image)s: pulling the layers it lacks from the console's registry")),
    shape(gettext_noop("%(node)s: %(done)s MiB of %(image)s received (%(rate)s MiB/s)")),
    shape(gettext_noop("%(node)s: %(image)s pulled, %(done)s MiB received in %(seconds)s s")),
    shape(gettext_noop("%(node)s forwards no port to the console's registry (%(reason)s): copying the archive")),
    shape(gettext_noop("%(node)s has no %(image)s: copying it from the console (%(size)s MiB)")),
    shape(gettext_noop("%(node)s: %(done)s of %(size)s MiB of %(image)s copied (%(rate)s MiB/s)")),
    shape(gettext_noop("%(node)s: loading %(image)s (copied in %(seconds)s s)")),
    shape(gettext_noop("%(worker)s: container removed, no process left")),
    shape(gettext_noop("%(worker)s: container removed after its failed preparation")),
    shape(gettext_noop("%(worker)s: %(count)s process(es) could not be ended")),
)
# A step of a worker's preparation that failed: the runtime's NodeError, "NODE: STEP failed: REASON" (the reason
# is the node's or a library's own words, shown as they are).
NODE_FAILURE = re.compile(r"^(?P<node>[^:\s]+): (?P<step>.+?) failed: (?P<reason>.*)$", re.S)
NODE_FAILURE_WORDS = gettext_noop("%(node)s: %(step)s failed: %(reason)s")
FIXED_STEPS = {text: text for text in (
    gettext_noop("starting the container's sshd"),
    gettext_noop("choosing the image"),
    gettext_noop("node preparation"),
    gettext_noop("laying out the job's files"),
    gettext_noop("giving the job its files"),
    gettext_noop("applying the job's network policy"),
    gettext_noop("starting the container"),
    gettext_noop("sealing the launch's programs"),
    gettext_noop("making the image cache"),
    gettext_noop("listing the input"),
    gettext_noop("bringing the checkpoint back"),
    gettext_noop("upload"),
)}
PATTERN_STEPS = (
    shape(gettext_noop("fetching the %(what)s")),
    shape(gettext_noop("pulling %(image)s")),
    shape(gettext_noop("waiting to bring %(image)s")),
    shape(gettext_noop("naming %(image)s")),
    shape(gettext_noop("copying %(image)s")),
    shape(gettext_noop("loading %(image)s")),
    shape(gettext_noop("SSH to %(address)s")),
    shape(gettext_noop("making %(path)s")),
    shape(gettext_noop("listing %(name)s")),
    shape(gettext_noop("mounting the shared file system %(path)s")),
    shape(gettext_noop("making your folder %(path)s on the shared file system")),
)
# What the data's messages call what they bring (a Staging's `what`).
STAGED_WHAT = {text: text for text in (gettext_noop("input"), gettext_noop("checkpoint"))}


def _by_shape(text: str, fixed: dict[str, str], patterns: tuple[tuple[re.Pattern[str], str], ...]) -> str | None:
    if text in fixed:
        return _(text)
    for pattern, words in patterns:
        match = pattern.match(text)  # from the start; the pattern's \Z holds it to the end
        if match:
            values = match.groupdict()
            if "what" in values:
                values["what"] = _(values["what"]) if values["what"] in STAGED_WHAT else values["what"]
            return _(words) % values
    return None


def translated_message(text: str) -> str:
    said = _by_shape(text, FIXED_MESSAGES, PATTERN_MESSAGES)
    if said is not None:
        return said
    failed = NODE_FAILURE.match(text)
    if failed:
        step = _by_shape(failed["step"], FIXED_STEPS, PATTERN_STEPS)
        if step is not None:
            return _(NODE_FAILURE_WORDS) % {"node": failed["node"], "step": step, "reason": failed["reason"]}
    return text
