"""The domain's records: what can run (specs, nodes, engines), and what ran (jobs, workers, logs)."""

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .secret_box import open_secret, seal_secret


class Network(models.TextChoices):
    NONE = "none", _("None (single node)")
    SOCKET = "socket", _("TCP sockets")
    INFINIBAND = "ib", _("InfiniBand")
    ROCE = "roce", _("RoCE")


class ResourceSpec(models.Model):
    """A flavor: what one node of a job gets, shown as the reference platform shows it."""

    name = models.SlugField(max_length=64, unique=True)
    gpu_count = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=64, blank=True)
    cpu_cores = models.PositiveIntegerField()
    memory_gb = models.PositiveIntegerField()
    # A CPU flavor has no GPUs to count processes by, so it says how many it runs per node.
    cpu_slots_per_node = models.PositiveIntegerField(default=1)
    network = models.CharField(max_length=8, choices=Network.choices, default=Network.SOCKET)
    max_nodes = models.PositiveIntegerField(default=16)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.display

    @property
    def display(self) -> str:
        parts = []
        if self.gpu_count:
            parts.append(f"GPU: {self.gpu_count} × {self.gpu_model or 'GPU'}")
        parts.append(f"CPU: {self.cpu_cores} cores")
        parts.append(f"Memory: {self.memory_gb} GB")
        return " | ".join(parts)

    @property
    def processes_per_node(self) -> int:
        return self.gpu_count or self.cpu_slots_per_node


class ResourcePool(models.Model):
    class Kind(models.TextChoices):
        PUBLIC = "public", _("Public")
        DEDICATED = "dedicated", _("Dedicated")

    name = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.PUBLIC)

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    class State(models.TextChoices):
        READY = "Ready", _("Ready")
        NOT_READY = "NotReady", _("NotReady")

    name = models.CharField(max_length=64, unique=True)
    address = models.GenericIPAddressField()
    ssh_port = models.PositiveIntegerField(default=22)
    ssh_user = models.CharField(max_length=32, default="root")
    sealed_private_key = models.TextField(blank=True, editable=False)
    # Pinned on first contact; a node that later shows another key is refused.
    host_key = models.TextField(blank=True)
    spec = models.ForeignKey(ResourceSpec, on_delete=models.PROTECT, related_name="nodes")
    pool = models.ForeignKey(ResourcePool, on_delete=models.PROTECT, related_name="nodes", null=True, blank=True)
    enabled = models.BooleanField(default=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    state_message = models.TextField(blank=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    # The allocation itself: set and cleared by compare-and-set updates (see jobs.allocation).
    allocated_to = models.ForeignKey(
        "TrainingJob", on_delete=models.SET_NULL, null=True, blank=True, related_name="allocated_nodes"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def private_key(self) -> str:
        return open_secret(self.sealed_private_key)

    @private_key.setter
    def private_key(self, value: str) -> None:
        self.sealed_private_key = seal_secret(value)


class Engine(models.Model):
    name = models.CharField(max_length=64, unique=True)

    def __str__(self) -> str:
        return self.name


class EngineVersion(models.Model):
    engine = models.ForeignKey(Engine, on_delete=models.CASCADE, related_name="versions")
    version = models.CharField(max_length=128)
    python = models.CharField(max_length=256, default="python", help_text=_("Interpreter that runs the boot file."))
    default_env = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["engine__name", "version"]
        constraints = [models.UniqueConstraint(fields=["engine", "version"], name="unique_engine_version")]

    def __str__(self) -> str:
        return f"{self.engine.name} {self.version}"


class LauncherDefaults(models.Model):
    """The admin-editable defaults a job copies when it is created (a job keeps what it launched with)."""

    bind_args = models.CharField(max_length=512, default="-bind-to none -map-by slot")
    x_args = models.CharField(
        max_length=1024,
        default=(
            "-x LD_LIBRARY_PATH -x HOROVOD_MPI_THREADS_DISABLE=1 -x NCCL_DEBUG=INFO "
            "-x NCCL_SOCKET_IFNAME=ib0,bond0,eth0 -x NCCL_SOCKET_FAMILY=AF_INET -x NCCL_IB_DISABLE=0"
        ),
    )
    mca_args = models.CharField(max_length=1024, default="-mca pml ob1 -mca btl ^openib -mca plm_rsh_no_tree_spawn true")
    tune_prefixes = models.CharField(max_length=256, default="MA_,SHARED_,S3_,PATH,VC_WORKER_,SCC,CRED")
    sshd_port_min = models.PositiveIntegerField(default=30000)
    sshd_port_max = models.PositiveIntegerField(default=30999)

    class Meta:
        verbose_name_plural = "launcher defaults"

    def __str__(self) -> str:
        return "Launcher defaults"

    @classmethod
    def current(cls) -> "LauncherDefaults":
        defaults, _ = cls.objects.get_or_create(pk=1)
        return defaults


class CodeDirectory(models.Model):
    name = models.CharField(max_length=64, unique=True)
    path = models.CharField(max_length=1024)
    file_count = models.PositiveIntegerField(default=0)
    size_bytes = models.PositiveBigIntegerField(default=0)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class IllegalTransition(Exception):
    pass


class JobStatus(models.TextChoices):
    CREATING = "Creating", _("Creating")
    PENDING = "Pending", _("Pending")
    RUNNING = "Running", _("Running")
    COMPLETED = "Completed", _("Completed")
    FAILED = "Failed", _("Failed")
    TERMINATING = "Terminating", _("Terminating")
    TERMINATED = "Terminated", _("Terminated")
    ABNORMAL = "Abnormal", _("Abnormal")


FINAL_STATES = {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.TERMINATED, JobStatus.ABNORMAL}
STOPPABLE_STATES = {JobStatus.CREATING, JobStatus.PENDING, JobStatus.RUNNING}
# Which states each state may be entered from; anything else is refused.
ALLOWED_FROM = {
    JobStatus.CREATING: {JobStatus.PENDING},
    JobStatus.RUNNING: {JobStatus.CREATING},
    JobStatus.COMPLETED: {JobStatus.RUNNING},
    JobStatus.FAILED: {JobStatus.PENDING, JobStatus.CREATING, JobStatus.RUNNING},
    JobStatus.TERMINATING: {JobStatus.CREATING, JobStatus.RUNNING},
    JobStatus.TERMINATED: {JobStatus.PENDING, JobStatus.TERMINATING},
    JobStatus.ABNORMAL: {JobStatus.PENDING, JobStatus.CREATING, JobStatus.RUNNING, JobStatus.TERMINATING},
}


class TrainingJob(models.Model):
    name = models.CharField(max_length=64)
    description = models.CharField(max_length=256, blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="training_jobs")
    engine_version = models.ForeignKey(EngineVersion, on_delete=models.PROTECT, related_name="jobs")
    code_dir = models.ForeignKey(CodeDirectory, on_delete=models.PROTECT, related_name="jobs")
    boot_file = models.CharField(max_length=512)
    parameters = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    spec = models.ForeignKey(ResourceSpec, on_delete=models.PROTECT, related_name="jobs")
    pool = models.ForeignKey(ResourcePool, on_delete=models.PROTECT, null=True, blank=True, related_name="jobs")
    node_count = models.PositiveIntegerField(default=1)
    extra_args = models.CharField(max_length=1024, blank=True)
    auto_stop_hours = models.PositiveIntegerField(null=True, blank=True)

    # What the job was launched with, copied from LauncherDefaults when it was created.
    bind_args = models.CharField(max_length=512)
    x_args = models.CharField(max_length=1024)
    mca_args = models.CharField(max_length=1024)
    tune_prefixes = models.CharField(max_length=256)
    sshd_port = models.PositiveIntegerField(null=True, blank=True)

    # What was really run, kept as launched.
    command_template = models.TextField(blank=True)
    command = models.TextField(blank=True)
    hostfile = models.TextField(blank=True)
    tune_file = models.TextField(blank=True)
    # The job's own SSH key (mpirun between its containers, the console into worker-0) and host key.
    sealed_ssh_key = models.TextField(blank=True, editable=False)
    host_public_key = models.TextField(blank=True, editable=False)

    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING, db_index=True)
    status_message = models.TextField(blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    log_line_count = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATES

    @property
    def can_stop(self) -> bool:
        return self.status in STOPPABLE_STATES

    @property
    def dns_name(self) -> str:
        """A hostname-safe form of the job's name (names may hold `_`, hostnames may not)."""
        import re

        slug = re.sub(r"[^a-z0-9-]+", "-", self.name.lower()).strip("-")[:40] or "job"
        return f"{slug}-{self.pk}"

    @property
    def duration_seconds(self) -> float | None:
        if not self.started_at:
            return None
        end = self.ended_at or timezone.now()
        return (end - self.started_at).total_seconds()

    def transition(self, to: str, message: str = "", **fields) -> None:
        """Move to state `to` if the current state allows it, atomically against concurrent movers.

        The update is conditional on the state in the database, so a stop racing a launch cannot
        both succeed: one of them gets IllegalTransition.
        """
        allowed = ALLOWED_FROM[JobStatus(to)]
        now = timezone.now()
        if to == JobStatus.RUNNING:
            fields.setdefault("started_at", now)
        if JobStatus(to) in FINAL_STATES:
            fields.setdefault("ended_at", now)
        if message:
            fields["status_message"] = message
        with transaction.atomic():
            updated = TrainingJob.objects.filter(pk=self.pk, status__in=allowed).update(status=to, **fields)
            if not updated:
                current = TrainingJob.objects.filter(pk=self.pk).values_list("status", flat=True).first()
                raise IllegalTransition(f"job {self.pk} cannot go from {current} to {to}")
            JobEvent.objects.create(job_id=self.pk, kind=f"state:{to}", message=message or to)
        self.status = to
        for key, value in fields.items():
            setattr(self, key, value)

    def begin_creating(self) -> None:
        self.transition(JobStatus.CREATING, "Nodes allocated, preparing the containers")

    def start(self) -> None:
        self.transition(JobStatus.RUNNING, "Training started")

    def finish(self, exit_code: int) -> None:
        if exit_code == 0:
            self.transition(JobStatus.COMPLETED, "Training end with return code: 0", exit_code=0)
        else:
            self.transition(JobStatus.FAILED, f"Training end with return code: {exit_code}", exit_code=exit_code)

    def fail(self, message: str) -> None:
        self.transition(JobStatus.FAILED, message)

    def terminate(self) -> bool:
        """Ask the job to stop. Returns True when it is already over (it was only queued)."""
        if self.status == JobStatus.PENDING:
            try:
                self.transition(JobStatus.TERMINATED, "Stopped by the user while queued")
                return True
            except IllegalTransition:
                self.refresh_from_db()
        if self.status not in (JobStatus.CREATING, JobStatus.RUNNING):
            raise IllegalTransition(f"a job in state {self.status} cannot be stopped")
        self.transition(JobStatus.TERMINATING, "Stop requested by the user")
        return False


class Worker(models.Model):
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="workers")
    index = models.PositiveIntegerField()
    node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, related_name="workers")
    node_name = models.CharField(max_length=64)
    address = models.GenericIPAddressField()
    hostname = models.CharField(max_length=128)
    state = models.CharField(max_length=32, default="Allocated")
    message = models.TextField(blank=True)
    # The container's first process on the node, as the node sees it; ending it ends the container.
    container_pid = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="unique_worker_index")]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        return f"worker-{self.index}"


class JobEvent(models.Model):
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=64)
    message = models.TextField()

    class Meta:
        ordering = ["at", "id"]


class LogStream(models.TextChoices):
    STDOUT = "stdout", "stdout"
    STDERR = "stderr", "stderr"
    SYSTEM = "system", "system"


class LogLine(models.Model):
    """One line of a job's log; `seq` orders a job's lines and is the cursor readers resume from."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="log_lines")
    seq = models.PositiveBigIntegerField()
    worker_index = models.PositiveIntegerField(null=True, blank=True)
    rank = models.PositiveIntegerField(null=True, blank=True)
    stream = models.CharField(max_length=8, choices=LogStream.choices)
    text = models.TextField()
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="unique_log_seq")]
