"""The creation page's live preview: the command a job would run, built by the launch's own code.

The form is bound and validated as for a submission; the job it describes is laid out as the
launch plans it (jobs.launch.plan: the same command builder and worker-0 environment), with the
worker hostnames and SSH port the next job would get. Nothing is saved.
"""

from typing import TypedDict

from django.db.models import Max

from jobs.allocation import nodes_for
from jobs.code_dirs.service import python_files
from jobs.launch.command_builder import JOB_DIR, CommandError
from jobs.launch.masking import mask_shell_text, tune_file_names
from jobs.launch.plan import job_command
from jobs.launch.platform_env import worker_hostname
from jobs.models import LauncherDefaults, TrainingJob
from jobs.submission.forms import TrainingJobForm, form_errors
from jobs.submission.jobs import job_from_form, sshd_port_for


class PreviewAnswer(TypedDict, total=False):
    """What the creation page shows beside the form (JSON)."""

    ready: bool
    errors: dict[str, list[str]]
    empty: list[str]
    boot_files: list[str]
    working_dir: str
    max_nodes: int | None
    nodes_in_pool: int
    processes_per_node: int
    blocking: list[str]
    template: str
    expanded: str
    np: int
    hostfile: str
    tune_names: list[str]
    sshd_port: int | None


# The fields the command is made of; while one of them is wrong there is no command to show.
COMMAND_FIELDS = ("engine", "code_dir", "boot_file", "spec", "node_count", "parameters", "env", "extra_args",
                  "data_url", "train_url")


def _errors(form: TrainingJobForm) -> tuple[dict[str, list[str]], list[str]]:
    """The form's messages by field, and the fields that are only still empty (not wrong)."""
    found = form.errors.get_json_data()
    empty = [field for field, errors in found.items() if any(error["code"] == "required" for error in errors)]
    return form_errors(form), empty


def _job_as_it_would_be(form: TrainingJobForm) -> TrainingJob:
    job = job_from_form(form)
    # Never saved: the id only names the hostnames and picks the port as submission would.
    job.pk = (TrainingJob.objects.aggregate(last=Max("pk"))["last"] or 0) + 1
    job.name = job.name or "job"
    job.sshd_port = sshd_port_for(job.pk, LauncherDefaults.current())
    return job


def preview(form: TrainingJobForm) -> PreviewAnswer:
    """What the page shows beside the form: the command, OPENMPI_NP, the hostfile, and the form's errors."""
    form.is_valid()
    data = form.cleaned_data
    errors, empty = _errors(form)
    code_dir, spec = data.get("code_dir"), data.get("spec")
    answer: PreviewAnswer = {
        "ready": False,
        "errors": errors,
        "empty": empty,
        "boot_files": python_files(code_dir) if code_dir else [],
        "working_dir": f"{JOB_DIR}/{code_dir.name}" if code_dir else "",
        "max_nodes": None,
    }
    if spec:
        capacity = nodes_for(TrainingJob(spec=spec, pool=data.get("pool"))).filter(enabled=True).count()
        answer["max_nodes"] = min(spec.max_nodes, capacity) if capacity else spec.max_nodes
        answer["nodes_in_pool"] = capacity
        answer["processes_per_node"] = spec.processes_per_node
    blocking = [field for field in COMMAND_FIELDS if field in errors or (field not in data and form.fields[field].required)]
    if blocking:
        answer["blocking"] = blocking
        return answer
    job = _job_as_it_would_be(form)
    hostnames = [worker_hostname(job.dns_name, index) for index in range(job.node_count)]
    try:
        command = job_command(job.launch_values(), hostnames, [f"<{name} address>" for name in hostnames])
    except CommandError as error:
        errors.setdefault(error.field, []).append(error.message)
        answer["blocking"] = [error.field]
        return answer
    answer.update(PreviewAnswer(
        ready=True,
        template=mask_shell_text(command.template),
        expanded=mask_shell_text(command.expanded),
        np=int(command.variables["OPENMPI_NP"]),
        hostfile=command.hostfile,
        tune_names=tune_file_names(command.tune_file),
        working_dir=command.working_dir,
        sshd_port=job.sshd_port,
    ))
    return answer
