from rest_framework import serializers

from jobs.allocation import waiting_reason
from jobs.launch.masking import mask_shell_text, masked
from jobs.models import CodeDirectory, EngineVersion, ResourceSpec, TrainingJob, Worker


class SpecSerializer(serializers.ModelSerializer):
    display = serializers.CharField(read_only=True)
    processes_per_node = serializers.IntegerField(read_only=True)

    class Meta:
        model = ResourceSpec
        fields = ["id", "name", "display", "gpu_count", "gpu_model", "cpu_cores", "memory_gb",
                  "cpu_slots_per_node", "processes_per_node", "network", "max_nodes"]


class EngineSerializer(serializers.ModelSerializer):
    name = serializers.SerializerMethodField()
    engine = serializers.CharField(source="engine.name")

    class Meta:
        model = EngineVersion
        fields = ["id", "name", "engine", "version", "python"]

    def get_name(self, version: EngineVersion) -> str:
        return str(version)


class CodeDirSerializer(serializers.ModelSerializer):
    class Meta:
        model = CodeDirectory
        fields = ["id", "name", "file_count", "size_bytes", "created_at"]


class WorkerSerializer(serializers.ModelSerializer):
    name = serializers.CharField(read_only=True)

    class Meta:
        model = Worker
        fields = ["name", "index", "node_name", "address", "hostname", "state", "message"]


class TrainingJobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    engine = serializers.CharField(source="engine_version.__str__")
    code_dir = serializers.CharField(source="code_dir.name")
    spec = serializers.CharField(source="spec.name")
    spec_display = serializers.CharField(source="spec.display")
    workers = WorkerSerializer(many=True, read_only=True)
    duration_seconds = serializers.FloatField(read_only=True)
    waiting_reason = serializers.SerializerMethodField()

    class Meta:
        model = TrainingJob
        fields = ["id", "name", "description", "owner", "status", "status_message", "engine", "code_dir",
                  "boot_file", "parameters", "env", "spec", "spec_display", "node_count", "extra_args",
                  "command_template", "command", "hostfile", "tune_file", "sshd_port", "workers", "exit_code",
                  "created_at", "started_at", "ended_at", "duration_seconds", "log_line_count", "waiting_reason"]

    def get_waiting_reason(self, job: TrainingJob) -> str:
        return waiting_reason(job)

    def to_representation(self, job: TrainingJob) -> dict:
        shown = super().to_representation(job)
        request = self.context.get("request")
        if request is not None and request.user.pk == job.owner_id:
            return shown
        # Anyone else (staff allowed to look) sees the job with its secret-looking values masked.
        if "env" in shown:
            shown["env"] = {name: masked(name, value) for name, value in shown["env"].items()}
        if "parameters" in shown:
            shown["parameters"] = [{**item, "value": masked(str(item.get("name", "")), str(item.get("value", "")))}
                                   for item in shown["parameters"]]
        for field in ("command_template", "command", "hostfile", "extra_args"):
            if field in shown:
                shown[field] = mask_shell_text(shown[field])
        return shown


class TrainingJobListSerializer(TrainingJobSerializer):
    class Meta(TrainingJobSerializer.Meta):
        fields = ["id", "name", "owner", "status", "engine", "spec", "spec_display", "node_count", "exit_code",
                  "created_at", "started_at", "ended_at", "duration_seconds", "final_metrics"]
