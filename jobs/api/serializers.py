"""What the API shows and takes, field by field; the descriptions here are the schema's (/api/v1/schema).

A job's detail holds its submission as given, under the same names: posting a detail back (its read-only
fields left out) submits an equal job. The job form (jobs.submission.forms) stays the one validator: these serializers
only describe the body a submission posts.
"""

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.allocation import waiting_reason
from jobs.launch.masking import mask_shell_text, masked
from jobs.models import (
    RANK_EXIT_NEVER,
    Attempt,
    Checkpoint,
    CodeDirectory,
    EngineVersion,
    EvidenceBundle,
    ResourceSpec,
    TrainingJob,
    Worker,
)
from jobs.row_ids import row_id
from jobs.submission.forms import SecondsOrOffField

# The platform's own arguments, which the form takes as fields and a job keeps as its first parameters.
URL_FIELDS = ("data_url", "train_url")


class SpecSerializer(serializers.ModelSerializer):
    display = serializers.CharField(read_only=True, help_text="How the reference platform shows the spec.")
    processes_per_node = serializers.IntegerField(
        read_only=True, help_text="Ranks per node: the GPU count, or the CPU slots for a CPU spec.")

    class Meta:
        model = ResourceSpec
        fields = ["id", "name", "display", "gpu_count", "gpu_model", "cpu_cores", "memory_gb",
                  "cpu_slots_per_node", "processes_per_node", "network", "max_nodes", "disk_gb"]
        extra_kwargs = {
            "id": {"help_text": "The spec's id; a submission may name the spec by it or by its name."},
            "name": {"help_text": "What a submission's `spec` names."},
            "gpu_count": {"help_text": "GPUs per node."},
            "cpu_cores": {"help_text": "CPU cores per node."},
            "memory_gb": {"help_text": "Memory per node, in GB."},
            "disk_gb": {"help_text": "The disk one worker may fill on its node (its home and its container's own "
                                     "files), in GiB; a worker past it is stopped."},
            "network": {"help_text": "What connects the nodes."},
        }


class EngineSerializer(serializers.ModelSerializer):
    engine = serializers.CharField(source="engine.name", read_only=True,
                                   help_text="The engine's name, as a submission's `engine` gives it (MPI, Horovod, ...).")
    engine_version = serializers.CharField(source="version", read_only=True,
                                           help_text="The version, as a submission's `engine_version` gives it.")

    class Meta:
        model = EngineVersion
        fields = ["id", "engine", "engine_version", "python"]
        extra_kwargs = {
            "id": {"help_text": "The engine version's id; a submission's `engine` may give it instead of the two names."},
            "python": {"help_text": "The interpreter that runs the boot file in the engine's image."},
        }


class CodeDirSerializer(serializers.ModelSerializer):
    owner = serializers.SerializerMethodField(help_text="Who uploaded it; null for the shipped examples.")
    group = serializers.SerializerMethodField(help_text="The group it is shared with when `sharing` is group.")

    class Meta:
        model = CodeDirectory
        fields = ["id", "name", "file_count", "size_bytes", "owner", "sharing", "group", "created_at"]
        extra_kwargs = {
            "id": {"help_text": "The code directory's id."},
            "name": {"help_text": "What a submission's `code_dir` names."},
            "file_count": {"help_text": "Files it holds."},
            "size_bytes": {"help_text": "Their size, in bytes."},
            "sharing": {"help_text": "Who besides its owner may see and run it."},
            "created_at": {"help_text": "When it was uploaded."},
        }

    def get_owner(self, code_dir: CodeDirectory) -> str | None:
        return code_dir.owner.username if code_dir.owner else None

    def get_group(self, code_dir: CodeDirectory) -> str | None:
        return code_dir.shared_with.name if code_dir.shared_with else None


class CodeDirSharingSerializer(serializers.Serializer):
    """Whom besides its owner a code directory is shown to: `sharing` (private, everyone or group) and, for a
    group, `group`: the name or id of one of the owner's groups. Naming a group alone means sharing with it.

    The context's `user` is the owner choosing; the instance, when given, is the code directory as it is.
    """

    sharing = serializers.ChoiceField(choices=CodeDirectory.Sharing.choices, required=False,
                                      help_text="private (the default), everyone, or group.")
    group = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=150,
                                  help_text="The name or id of one of the owner's groups, with sharing group.")

    def validate_group(self, value: str | None) -> Group | None:
        text = (value or "").strip()
        if not text:
            return None
        user = self.context["user"]
        groups = Group.objects.all() if user.is_superuser else user.groups.all()
        number = row_id(text)
        found = groups.filter(pk=number).first() if number is not None else None
        found = found or groups.filter(name=text).first()
        if found is None:
            # The same words whether the group exists or not: who is in which group is not told.
            raise serializers.ValidationError(f"You can share only with a group you belong to; {text!r} is not one of yours.")
        return found

    def validate(self, attrs: dict) -> dict:
        current = self.instance
        group_given = "group" in attrs
        group = attrs.get("group")
        sharing = attrs.get("sharing")
        if not sharing:
            if group is not None:
                sharing = CodeDirectory.Sharing.GROUP
            else:
                sharing = current.sharing if current else CodeDirectory.Sharing.PRIVATE
        if sharing == CodeDirectory.Sharing.GROUP:
            if not group_given and current is not None:
                group = current.shared_with
            if group is None:
                raise serializers.ValidationError({"group": ["Name the group to share the code directory with."]})
        elif group is not None:
            raise serializers.ValidationError({"group": ['A group is named only with sharing "group".']})
        return {"sharing": sharing, "shared_with": group}

    def update(self, instance: CodeDirectory, validated_data: dict) -> CodeDirectory:
        instance.sharing, instance.shared_with = validated_data["sharing"], validated_data["shared_with"]
        instance.save(update_fields=["sharing", "shared_with"])
        return instance


class CodeDirUploadSerializer(serializers.Serializer):
    """An upload of a code directory (multipart/form-data)."""

    name = serializers.CharField(max_length=64, help_text="The new code directory's name, unique in the console.")
    archive = serializers.FileField(help_text="A .zip or .tar.gz of the code; one top folder is taken off.")
    sharing = serializers.ChoiceField(choices=CodeDirectory.Sharing.choices, required=False,
                                      help_text="private (the default), everyone, or group.")
    group = serializers.CharField(required=False, max_length=150,
                                  help_text="The name or id of one of the uploader's groups, with sharing group.")


class WorkerSerializer(serializers.ModelSerializer):
    name = serializers.CharField(read_only=True, help_text="The worker's name in the job, <job>-worker-<index>.")

    class Meta:
        model = Worker
        fields = ["name", "index", "node_name", "address", "hostname", "state", "message"]
        extra_kwargs = {
            "index": {"help_text": "The worker's index: 0 runs mpirun."},
            "node_name": {"help_text": "The node it runs on."},
            "address": {"help_text": "The node's address."},
            "hostname": {"help_text": "The container's host name, as the hostfile gives it."},
            "state": {"help_text": "Where the worker's container is."},
            "message": {"help_text": "What happened to it last, in words."},
        }


class NameValueSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64, help_text="1-64 letters, digits, '-' or '_'.")
    value = serializers.CharField(allow_blank=True, max_length=4096,
                                  help_text="Passed to the boot file as --name=value.")


class MetricDefinitionSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64, help_text="The metric's name, e.g. loss.")
    regex = serializers.CharField(max_length=1024, help_text=(
        "An RE2 expression matched against each log line; its group `value` (else its first group) is the "
        "value, a group `step` the step."))


class SlurmFactsSerializer(serializers.Serializer):
    job_id = serializers.IntegerField(source="slurm_job_id", read_only=True, allow_null=True,
                                      help_text="The Slurm job's id; null for a job of the console's own pools.")
    state = serializers.CharField(source="slurm_state", read_only=True, help_text="Slurm's state of it, as last seen.")
    reason = serializers.CharField(source="slurm_reason", read_only=True,
                                   help_text="Why Slurm holds it, in words, with Slurm's reason code.")
    accounting = serializers.JSONField(source="slurm_accounting", read_only=True, help_text=(
        "slurmdbd's record once the job ended: account, qos, state, elapsed_seconds, nodes, cpus, gpus, "
        "cpu_hours, gpu_hours, cpu_time_used_seconds."))


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = ["attempt", "step", "path", "url", "size_bytes", "file_count", "saved_at", "program_time",
                  "after_notice_seconds"]
        extra_kwargs = {
            "attempt": {"help_text": "The attempt that saved it (1 for the first)."},
            "step": {"help_text": "The step its manifest gave."},
            "path": {"help_text": "Its file or folder under MA_CHECKPOINT_DIR."},
            "url": {"help_text": "Where it is in the store (under train_url/checkpoints/)."},
            "size_bytes": {"help_text": "Its size in the store."},
            "file_count": {"help_text": "How many files it is."},
            "saved_at": {"help_text": "When the console found every file of it in the store."},
            "program_time": {"help_text": "The time its manifest gave, as written (may be empty)."},
            "after_notice_seconds": {"help_text": "Seconds after the attempt's notice before a stop; null when "
                                                  "saved before any notice."},
        }


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["number", "started_at", "ended_at", "ended_as", "node_count", "gpu_count", "last_checkpoint_step",
                  "last_checkpoint_at", "lost_seconds", "lost_steps", "lost_node_hours", "lost_gpu_hours"]
        extra_kwargs = {
            "number": {"help_text": "The attempt (1 for the first)."},
            "started_at": {"help_text": "When it started running."},
            "ended_at": {"help_text": "When it ended."},
            "ended_as": {"help_text": "How it ended, in words."},
            "node_count": {"help_text": "Its nodes."},
            "gpu_count": {"help_text": "Its GPUs, all nodes together."},
            "last_checkpoint_step": {"help_text": "The step of its last checkpoint; null when it saved none."},
            "last_checkpoint_at": {"help_text": "When its last checkpoint was in the store."},
            "lost_seconds": {"help_text": "Seconds from its last checkpoint (its start, without one) to its end."},
            "lost_steps": {"help_text": "Steps from its last checkpoint (its first step, without one) to the last step "
                                        "its log showed; null when its log gave no step."},
            "lost_node_hours": {"help_text": "lost_seconds on all its nodes, in node-hours."},
            "lost_gpu_hours": {"help_text": "lost_seconds on all its GPUs, in GPU-hours."},
        }


# An evidence bundle as a job's detail lists it: each field and what it says.
EVIDENCE_FIELDS = {
    "id": "The bundle: its content is at /training-jobs/<job>/evidence/<id>.",
    "attempt": "The attempt it was taken of (1 for the first).",
    "reason": "Why it was taken: failure (the job failed) or watchdog (its ranks fell silent).",
    "taken_at": "When it was taken.",
}


class EvidenceSummarySerializer(serializers.ModelSerializer):
    class Meta:
        model = EvidenceBundle
        fields = list(EVIDENCE_FIELDS)
        extra_kwargs = {name: {"help_text": text} for name, text in EVIDENCE_FIELDS.items()}


@extend_schema_field({"oneOf": [{"type": "integer", "minimum": 0, "maximum": SecondsOrOffField.MAX_SECONDS},
                               {"type": "string", "enum": ["off"]}], "nullable": True})
class SecondsOrOffSerializerField(serializers.Field):
    """Seconds, or "off" (kept as RANK_EXIT_NEVER); null is the default. The form (SecondsOrOffField) validates."""

    def to_representation(self, value: int) -> int | str:
        return "off" if value == RANK_EXIT_NEVER else value

    def to_internal_value(self, data) -> int | None:
        try:
            return SecondsOrOffField().clean(data)
        except ValidationError as error:
            raise serializers.ValidationError(error.messages) from None


class TrainingJobSerializer(serializers.ModelSerializer):
    """A job: its writable fields are its submission, the read-only ones what became of it."""

    owner = serializers.CharField(source="owner.username", read_only=True, help_text="Who submitted it.")
    engine = serializers.CharField(source="engine_version.engine.name", help_text=(
        "The engine's name (MPI, Horovod, MindSpore-GPU), with `engine_version`; alone, its latest version. "
        "An engine version's id or version also names one."))
    engine_version = serializers.CharField(source="engine_version.version", required=False, help_text=(
        "The engine's version, as /api/v1/engines lists it."))
    code_dir = serializers.CharField(source="code_dir.name", help_text="The code directory's name (or id).")
    spec = serializers.CharField(source="spec.name", help_text="The spec's name (or id): what one node gets.")
    spec_display = serializers.CharField(source="spec.display", read_only=True,
                                         help_text="The spec as the reference platform shows it.")
    pool = serializers.CharField(source="pool.name", required=False, allow_null=True, default=None,
                                 help_text="The resource pool's name (or id); null for any pool.")
    data_url = serializers.CharField(required=False, allow_blank=True, max_length=1024,
                                     help_text="Where the input data is; passed first as --data_url.")
    train_url = serializers.CharField(required=False, allow_blank=True, max_length=1024, help_text=(
        "Where the job writes its outputs: an s3:// or obs:// folder (uploaded while the job runs and at its end), or "
        "a path in the container (collected from worker-0 when it ends)."))
    parameters = NameValueSerializer(many=True, required=False, help_text=(
        "Hyperparameters, in order; the boot file gets each as --name=value after data_url and train_url."))
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False,
                                help_text="Environment variables of every rank, NAME: value (MA_ names are the platform's).")
    metrics = MetricDefinitionSerializer(source="metric_definitions", many=True, required=False, help_text=(
        "How metrics are read from the log; none given (an empty list) means the defaults (loss, accuracy)."))
    workers = WorkerSerializer(many=True, read_only=True, help_text="One per node, once allocated.")
    duration_seconds = serializers.FloatField(read_only=True, allow_null=True,
                                              help_text="Seconds since it started running, or that it ran.")
    waiting_reason = serializers.SerializerMethodField(help_text="Why a Pending job waits, and where it stands; else empty.")
    slurm = SlurmFactsSerializer(source="*", read_only=True, help_text=(
        "A job of a Slurm pool: its Slurm job, what Slurm says of it, and slurmdbd's accounting once it ended."))
    final_metrics = serializers.DictField(child=serializers.FloatField(), read_only=True,
                                          help_text="Each metric's last value read from the log.")
    resume_from_job = serializers.IntegerField(source="resume_source_id", required=False, allow_null=True,
                                               min_value=1, max_value=2**63 - 1, help_text=("Start from the newest checkpoint of this job of yours (a "
                                                          "Rebuild that resumes): it gets MA_RESUME_FROM."))
    rebuilt_from = serializers.IntegerField(source="rebuilt_from_id", required=False, allow_null=True, min_value=1,
                                            max_value=2**63 - 1, help_text=(
                                                "The job of yours this one is a Rebuild of (its family: the list's "
                                                "?family=, and /training-jobs/compare); null for none."))
    rank_exit_grace_seconds = SecondsOrOffSerializerField(required=False, allow_null=True, help_text=(
        "How long the job may go on after one of its ranks ended not as 0 (or raised) while the others wait, "
        "before it fails: seconds (0: at once), \"off\" (never for this reason), or omitted or null: the "
        "console's RANK_EXIT_GRACE_SECONDS, read when the job runs."))
    checkpoints = CheckpointSerializer(source="newest_checkpoints", many=True, read_only=True, help_text=(
        "The newest checkpoints its program saved (MA_CHECKPOINT_DIR's manifest), newest first, at most "
        "CHECKPOINTS_IN_DETAIL (20); every one the console keeps is at /training-jobs/<id>/checkpoints."))
    checkpoint_count = serializers.IntegerField(source="checkpoints.count", read_only=True, help_text=(
        "How many checkpoints the console keeps of the job (the newest CHECKPOINTS_KEPT)."))
    evidence = serializers.SerializerMethodField(help_text=(
        "The evidence bundles taken when the job failed or its watchdog fired (its owner's only: empty for anyone "
        "else)."))
    attempts = AttemptSerializer(many=True, read_only=True, help_text=(
        "Each attempt that ended, with the work it lost since its last checkpoint."))

    class Meta:
        model = TrainingJob
        fields = ["id", "name", "description", "owner", "status", "status_message", "engine", "engine_version",
                  "code_dir", "boot_file", "data_url", "train_url", "parameters", "env", "spec", "spec_display", "pool",
                  "node_count", "extra_args", "auto_stop_hours", "metrics", "watchdog_seconds", "watchdog_action",
                  "rank_exit_grace_seconds", "max_restarts", "predownload",
                  "checkpoint_grace_seconds", "checkpoint_signal", "resume_from_job", "rebuilt_from", "checkpoints",
                  "checkpoint_count", "attempts", "debug_hold_minutes", "held_until", "evidence",
                  "restart_count", "command_template",
                  "command", "hostfile", "tune_file", "sshd_port", "workers", "exit_code", "stop_reason", "created_at",
                  "started_at", "ended_at", "duration_seconds", "log_line_count", "final_metrics", "waiting_reason", "slurm"]
        read_only_fields = ["id", "status", "status_message", "command_template", "command", "hostfile", "tune_file",
                            "sshd_port", "exit_code", "stop_reason", "created_at", "started_at", "ended_at",
                            "log_line_count", "restart_count", "held_until"]
        extra_kwargs = {
            "id": {"help_text": "The job's id."},
            "name": {"help_text": "1-64 letters, digits, '-' or '_'."},
            "description": {"help_text": "Free text, up to 256 characters."},
            "status": {"help_text": "Pending -> Creating -> Running -> Completed / Failed; Terminating -> Terminated "
                                    "on a stop; Abnormal when the console lost track of it."},
            "status_message": {"help_text": "What the last change of state said."},
            "boot_file": {"help_text": "The Python file mpirun runs, relative to the code directory."},
            "node_count": {"help_text": "Nodes (workers), at most the spec's max_nodes.", "min_value": 1},
            "extra_args": {"help_text": "OPENMPI_EXTRA_ARGS: mpirun options from the allow-list."},
            "auto_stop_hours": {"help_text": "Stop the job after this many hours (1-72); null for never.",
                                "min_value": 1, "max_value": 72},
            "watchdog_seconds": {"help_text": "Seconds a rank may print nothing before the job is suspected hung "
                                              "(0: no watchdog; omitted or null: the administrator's default, "
                                              "read when the job runs).",
                                 "min_value": 0, "max_value": 7 * 24 * 3600},
            "watchdog_action": {"help_text": "What the watchdog does once it suspects the job hangs: warn (marks it "
                                             "and lists its silent ranks) or stop (stops it as a user would, with "
                                             "its notice); omitted or null: the administrator's default, read when "
                                             "the job runs."},
            "max_restarts": {"help_text": "Auto restart: how many more attempts a job that fails for a restartable "
                                          "reason (a node or worker lost, NCCL or the network, a rank killed by a "
                                          "signal nobody sent) gets, 0-3; 0 is off.", "min_value": 0, "max_value": 3},
            "predownload": {"help_text": "Bring an s3:// or obs:// train_url's files back into the output folder before "
                                         "each start (the reference's predownload), to resume from a checkpoint."},
            "checkpoint_grace_seconds": {"help_text": "Before a stop the console decides (a user's, auto stop, the "
                                                      "watchdog), every rank gets checkpoint_signal and this many "
                                                      "seconds to save a checkpoint; 0 is no notice. At most the "
                                                      "administrator's maximum.", "min_value": 0, "max_value": 10**9},
            "checkpoint_signal": {"help_text": "The notice's signal: USR1 (the default), USR2, INT or TERM."},
            "debug_hold_minutes": {"help_text": "After a failure, keep the job's containers and nodes this many "
                                                "minutes for a look inside (a terminal), then tear them down; 0 (the "
                                                "default) tears them down at once. At most the administrator's "
                                                "maximum.", "min_value": 0, "max_value": 10**9},
            "held_until": {"help_text": "While a failed job's containers and nodes are held for debugging: when the "
                                        "hold ends; null otherwise."},
            "restart_count": {"help_text": "How many times auto restart has run the job again (MA_RESTART_COUNT)."},
            "command_template": {"help_text": "The background command with its ${VARIABLES}."},
            "command": {"help_text": "The command as run, expanded."},
            "hostfile": {"help_text": "mpirun's hostfile."},
            "tune_file": {"help_text": "The -x options worker-0 passes to every worker."},
            "sshd_port": {"help_text": "The port of the job's own sshd in every worker."},
            "exit_code": {"help_text": "mpirun's exit code: 0, or the first failed rank's."},
            "stop_reason": {"help_text": "Who stopped a stopped job: the user (empty), auto_stop or watchdog."},
            "created_at": {"help_text": "When it was submitted."},
            "started_at": {"help_text": "When it started running."},
            "ended_at": {"help_text": "When it ended."},
            "log_line_count": {"help_text": "Lines stored in its log (the last line's sequence number)."},
        }

    def get_waiting_reason(self, job: TrainingJob) -> str:
        return waiting_reason(job)

    @extend_schema_field(EvidenceSummarySerializer(many=True))
    def get_evidence(self, job: TrainingJob) -> list:
        request = self.context.get("request")
        if request is None or request.user.pk != job.owner_id:
            return []  # its ranks' output and stacks are the owner's alone
        return list(EvidenceSummarySerializer(job.evidence_bundles.defer("content"), many=True).data)

    def to_representation(self, job: TrainingJob) -> dict:
        shown = super().to_representation(job)
        if "parameters" in shown:
            shown.update(split_url_parameters(shown["parameters"]))
        request = self.context.get("request")
        if request is not None and request.user.pk == job.owner_id:
            return shown
        # Anyone else (staff allowed to look) sees the job with its secret-looking values masked.
        if "env" in shown:
            shown["env"] = {name: masked(name, value) for name, value in shown["env"].items()}
        if "parameters" in shown:
            shown["parameters"] = [{**item, "value": masked(str(item.get("name", "")), str(item.get("value", "")))}
                                   for item in shown["parameters"]]
        for field in URL_FIELDS:
            if field in shown:
                shown[field] = masked(field, shown[field])
        for checkpoint in shown.get("checkpoints") or []:
            checkpoint["url"] = masked("train_url", checkpoint["url"])
        for field in ("command_template", "command", "hostfile", "extra_args"):
            if field in shown:
                shown[field] = mask_shell_text(shown[field])
        return shown


def split_url_parameters(parameters: list[dict]) -> dict:
    """A job's parameters as a submission gives them: data_url and train_url, which the form puts first, as
    their own fields, so that submitting them again puts them back where they were."""
    rest, given = list(parameters), {}
    for field in URL_FIELDS:
        if rest and rest[0].get("name") == field:
            given[field] = rest.pop(0)["value"]
        else:
            given[field] = ""
    return {**given, "parameters": rest}


class TrainingJobListSerializer(TrainingJobSerializer):
    class Meta(TrainingJobSerializer.Meta):
        fields = ["id", "name", "owner", "status", "engine", "engine_version", "spec", "spec_display", "pool",
                  "node_count", "exit_code", "created_at", "started_at", "ended_at", "duration_seconds",
                  "final_metrics"]
