from django.contrib.auth.models import Group
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
    owner = serializers.SerializerMethodField()
    group = serializers.SerializerMethodField()

    class Meta:
        model = CodeDirectory
        fields = ["id", "name", "file_count", "size_bytes", "owner", "sharing", "group", "created_at"]

    def get_owner(self, code_dir: CodeDirectory) -> str | None:
        return code_dir.owner.username if code_dir.owner else None

    def get_group(self, code_dir: CodeDirectory) -> str | None:
        return code_dir.shared_with.name if code_dir.shared_with else None


class CodeDirSharingSerializer(serializers.Serializer):
    """Whom besides its owner a code directory is shown to: `sharing` (private, everyone or group) and, for a
    group, `group`: the name or id of one of the owner's groups. Naming a group alone means sharing with it.

    The context's `user` is the owner choosing; the instance, when given, is the code directory as it is.
    """

    sharing = serializers.ChoiceField(choices=CodeDirectory.Sharing.choices, required=False)
    group = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=150)

    def validate_group(self, value: str | None) -> Group | None:
        text = (value or "").strip()
        if not text:
            return None
        user = self.context["user"]
        groups = Group.objects.all() if user.is_superuser else user.groups.all()
        found = groups.filter(pk=int(text)).first() if text.isdigit() else None
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
