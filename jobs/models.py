"""The domain's records: what can run (specs, nodes, engines), and what ran (jobs, workers, logs)."""

import hashlib
import posixpath
import re
import secrets
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.dispatch import Signal
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from jobs.launch.checkpoint_contract import DEFAULT_NOTICE_SIGNAL, NOTICE_SIGNALS
from jobs.launch.command_builder import ENV_NAME_RE, CommandError, allowed_options, check_mpirun_options
from jobs.launch.data_paths import is_data_location, is_input, location_path
from jobs.launch.network_policy import PolicyError, parse_allowed_destinations
from jobs.launch.plan import JobValues, SharedMounts, SpecValues, SshTarget, WorkerValues
from jobs.object_store.access import Reach, reach
from jobs.object_store.client import StoreAccess
from jobs.object_store.urls import OBJECT_SCHEMES, parse_object_url

from .secret_box import open_secret, seal_secret

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from django_stubs_ext import StrPromise

    Rows = TypeVar("Rows", bound=models.Model)


class Network(models.TextChoices):
    NONE = "none", _("None (single node)")
    SOCKET = "socket", _("TCP sockets")
    INFINIBAND = "ib", _("InfiniBand")
    ROCE = "roce", _("RoCE")


class ResourceSpec(models.Model):
    """A flavor: what one node of a job gets, shown as the reference platform shows it."""

    name = models.SlugField(max_length=64, unique=True)
    gpu_count = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=64, blank=True, help_text=_("As the flavor names it, e.g. NVIDIA-V100."))
    cpu_cores = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    memory_gb = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    # A CPU flavor has no GPUs to count processes by, so it says how many it runs per node.
    cpu_slots_per_node = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1)],
        help_text=_("Processes per node for a CPU flavor; a GPU flavor runs one per GPU."),
    )
    network = models.CharField(max_length=8, choices=Network.choices, default=Network.SOCKET)
    max_nodes = models.PositiveIntegerField(
        default=16, validators=[MinValueValidator(1)], help_text=_("The most nodes one job may ask for.")
    )
    disk_gb = models.PositiveIntegerField(
        default=50, validators=[MinValueValidator(1)],
        help_text=_("The most disk one worker may fill on its node (its home and its container's own files); "
                    "a worker past it is stopped."),
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.display

    def clean(self) -> None:
        if self.gpu_count and not self.gpu_model.strip():
            raise ValidationError({"gpu_model": _("A GPU flavor names its GPU model.")})

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

    class Backend(models.TextChoices):
        CONSOLE = "console", _("The console's own nodes")
        SLURM = "slurm", _("A Slurm partition")

    name = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.PUBLIC)
    # Who allocates the pool's nodes: the console's own allocator, or Slurm (jobs.backends).
    backend = models.CharField(max_length=16, choices=Backend.choices, default=Backend.CONSOLE)
    slurm_url = models.URLField(blank=True, help_text=_("slurmrestd's address, e.g. http://slurm.example.org:6820 "
                                                         "(it must serve openapi/v0.0.38, Slurm 22.05)."))
    slurm_partition = models.CharField(max_length=64, blank=True)
    slurm_user = models.CharField(max_length=64, blank=True,
                                  help_text=_("The Slurm user the console submits the pool's jobs as."))
    slurm_account = models.CharField(max_length=64, blank=True,
                                     help_text=_("The account the pool's jobs are charged to (blank: the user's default)."))
    # One of the two, sealed as node keys are and never shown back: a token (`scontrol token`), which
    # expires, or the cluster's HS256 key, from which the console makes short-lived tokens itself.
    sealed_slurm_token = models.TextField(blank=True, editable=False)
    sealed_slurm_jwt_key = models.TextField(blank=True, editable=False)
    # How the console reaches the nodes Slurm gives (each registered in this pool with its key). Without root
    # (the default), as the Slurm user: Slurm's step runs the containers with that user's rootless Podman,
    # under the job's cgroups. With root, as on the console's own pools: an administrator's explicit choice,
    # said on the pool's page.
    slurm_root_ssh = models.BooleanField(
        default=False, help_text=_("Run the jobs' containers over the console's root SSH to the nodes Slurm "
                                   "allocates, outside Slurm's cgroups. Unticked, the console logs in as the "
                                   "Slurm user (register the nodes with that user and its key) and Slurm's job "
                                   "step runs the containers with that user's rootless Podman."))
    # What the last look at slurmrestd found ("Slurm 22.05.8", or why it could not be reached).
    slurm_status = models.TextField(blank=True, editable=False)
    slurm_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    # What Slurm last said of the partition's nodes ({name, state, reason, cpus, alloc_cpus, memory_mb, gres})
    # and of its accounts ({account, parent, shares, norm_shares, cpu_hours, gpu_hours, jobs, usage_share}),
    # renewed every 30 s (jobs.backends.slurm) for the capacity page.
    slurm_nodes = models.JSONField(default=list, blank=True, editable=False)
    slurm_accounts = models.JSONField(default=list, blank=True, editable=False)
    slurm_snapshot_at = models.DateTimeField(null=True, blank=True, editable=False)

    def __str__(self) -> str:
        return self.name

    @property
    def is_slurm(self) -> bool:
        return self.backend == self.Backend.SLURM

    def clean(self) -> None:
        if not self.is_slurm:
            return
        missing = [label for label, value in ((_("slurmrestd's address"), self.slurm_url),
                                              (_("the partition"), self.slurm_partition),
                                              (_("the Slurm user"), self.slurm_user)) if not value]
        if missing:
            raise ValidationError(_("A Slurm pool needs %(missing)s.") % {"missing": ", ".join(str(m) for m in missing)})

    @property
    def slurm_work_root(self) -> str:
        """Where its jobs' folders go on its nodes when they are reached without root: the Slurm user's own."""
        return settings.SLURM_WORK_ROOT.format(user=self.slurm_user)

    @property
    def slurm_token(self) -> str:
        return open_secret(self.sealed_slurm_token) if self.sealed_slurm_token else ""

    @property
    def slurm_jwt_key(self) -> str:
        return open_secret(self.sealed_slurm_jwt_key) if self.sealed_slurm_jwt_key else ""


def user_slug(user_id: int, username: str) -> str:
    """A user's name as a bucket or folder may carry it: their number first, so that two names written alike
    (Alice, alice.) stay apart."""
    slug = re.sub(r"[^a-z0-9]+", "-", username.lower()).strip("-")
    return f"{user_id}-{slug}".rstrip("-")


def usable_in_pool(rows: "QuerySet[Rows]", pool_id: int | None, *, any_without_pool: bool) -> "QuerySet[Rows]":
    """The enabled rows (stores, shared paths: each names its pools, none meaning every pool) a job of this pool
    may use; for a job of no pool, every one (any_without_pool) or those of every pool only."""
    rows = rows.filter(enabled=True)
    if pool_id is None and any_without_pool:
        return rows
    return rows.filter(models.Q(pools__isnull=True) | models.Q(pools=pool_id)).distinct()


class Storage(models.Model):
    """An S3-compatible object store (Huawei OBS is one) that jobs' data_url and train_url may name.

    The console holds its keys (sealed as node keys are, never shown back) and hands the nodes presigned
    URLs, one per object, so the bytes go between the store and the nodes and the keys never leave the
    console. With these keys each user reaches one bucket of their own (user_bucket): the keys could read
    every bucket, the console lets a user name only theirs. Where the store allows it, a user may keep keys of
    their own to it (UserStoreKeys), which reach whatever else the store lets those keys reach.
    """

    name = models.SlugField(max_length=64, unique=True)
    endpoint_url = models.URLField(help_text=_("The store's S3 endpoint, reachable from the console and from the "
                                               "nodes, e.g. https://obs.example.org or http://10.0.0.5:8333."))
    region = models.CharField(max_length=64, default="us-east-1")
    path_style = models.BooleanField(default=True, help_text=_("Address buckets as endpoint/bucket (most "
                                                                "self-hosted stores), not as bucket.endpoint."))
    schemes = models.CharField(max_length=32, default="s3 obs",
                               help_text=_("The URL schemes this store answers to, separated by spaces: s3, obs."))
    sealed_access_key = models.TextField(editable=False)
    sealed_secret_key = models.TextField(editable=False)
    user_bucket_prefix = models.CharField(
        max_length=16, default="user-",
        help_text=_("Each user's bucket is this prefix, their user number and their name (user-3-alice)."))
    pools = models.ManyToManyField(ResourcePool, blank=True, related_name="storages",
                                   help_text=_("The pools whose jobs may use this store (none: every pool)."))
    users_may_bring_keys = models.BooleanField(
        default=False,
        help_text=_("Users may keep their own keys to this store (sealed, never shown back) and name any bucket "
                    "those keys reach; the store, not the console, then decides what they may read and write."))
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        unknown = [scheme for scheme in self.schemes.split() if scheme not in OBJECT_SCHEMES]
        if unknown or not self.schemes.split():
            raise ValidationError({"schemes": _("Name one or more of: %(known)s.") % {"known": ", ".join(OBJECT_SCHEMES)}})
        if self.user_bucket_prefix and not re.fullmatch(r"[a-z0-9][a-z0-9-]*", self.user_bucket_prefix):
            raise ValidationError({"user_bucket_prefix": _("Lower-case letters, digits and hyphens only.")})

    def set_keys(self, access_key: str, secret_key: str) -> None:
        self.sealed_access_key, self.sealed_secret_key = seal_secret(access_key), seal_secret(secret_key)

    def access(self) -> StoreAccess:
        return self.access_with(open_secret(self.sealed_access_key), open_secret(self.sealed_secret_key))

    def access_with(self, access_key: str, secret_key: str) -> StoreAccess:
        """This store's address with the keys given (its own, a user's kept ones, or ones being checked)."""
        return StoreAccess(endpoint_url=self.endpoint_url, access_key=access_key, secret_key=secret_key,
                           region=self.region, path_style=self.path_style)

    def user_bucket(self, user_id: int, username: str) -> str:
        return f"{self.user_bucket_prefix}{user_slug(user_id, username)}"[:63].rstrip("-")

    @classmethod
    def answering(cls, scheme: str, pool_id: int | None) -> "Storage | None":
        """The store a URL of this scheme names for a job in this pool (no pool: any store; None: none answers)."""
        return next((storage for storage in usable_in_pool(cls.objects.all(), pool_id, any_without_pool=True)
                     if scheme in storage.schemes.split()), None)

    def keys_of(self, user_id: int) -> StoreAccess | None:
        """The user's own keys to this store, where it takes them and they set some."""
        if not self.users_may_bring_keys:
            return None
        kept = UserStoreKeys.objects.filter(storage=self, user_id=user_id).first()
        if kept is None:
            return None
        kept.storage = self
        return kept.access()

    @classmethod
    def reach_for(cls, text: str, pool_id: int | None, user_id: int, username: str) -> Reach:
        """Where the user's object URL leads for a job of this pool (no pool: any store), with the store's keys for
        their own bucket or their own keys for another; ObjectUrlError, in words, where they may not go."""
        url = parse_object_url(text)
        storage = cls.answering(url.scheme, pool_id) if url else None
        return reach(text, storage, user_id, username, storage.keys_of(user_id) if storage else None)


class UserStoreKeys(models.Model):
    """A user's own keys to one object store, sealed as the store's are and never shown back to anyone.

    They reach the buckets beyond the user's own that the store lets them reach (jobs.object_store.access);
    each job, listing and link made for the user uses them, so the store's own rules apply to what the user
    reads and writes through the console.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="store_keys")
    storage = models.ForeignKey(Storage, on_delete=models.CASCADE, related_name="user_keys")
    sealed_access_key = models.TextField(editable=False)
    sealed_secret_key = models.TextField(editable=False)
    set_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["storage__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["user", "storage"], name="one_set_of_keys_per_user_and_store")]
        verbose_name = _("user's object-store keys")
        verbose_name_plural = _("users' object-store keys")

    def __str__(self) -> str:
        return f"{self.user} @ {self.storage}"

    @classmethod
    def keep(cls, user, storage: Storage, access_key: str, secret_key: str) -> "UserStoreKeys":
        """Set or replace the user's keys to the store, sealed."""
        kept, _made = cls.objects.update_or_create(user=user, storage=storage, defaults={
            "sealed_access_key": seal_secret(access_key), "sealed_secret_key": seal_secret(secret_key),
            "set_at": timezone.now()})
        return kept

    def access(self) -> StoreAccess:
        """The store's address with these keys."""
        return self.storage.access_with(open_secret(self.sealed_access_key), open_secret(self.sealed_secret_key))


# Where a shared file system may not be mounted from or into: the system's own folders and the job's home.
FORBIDDEN_SHARED_ROOTS = ("/bin", "/boot", "/dev", "/etc", "/home/ma-user", "/lib", "/lib64", "/opt/training-console",
                          "/proc", "/root", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var/lib/training-console")


class SharedPath(models.Model):
    """A file system every node of some pools mounts at the same path (NFS, Lustre, BeeGFS...), as Slurm sites
    have. Read-only: a job's input under it is mounted read-only into its containers, at the same path, not
    copied. Writable: each user has a folder of their own in it (user_folder), the only part of it their jobs
    see; it is mounted writable where the job's train_url lies in it, read-only where only its inputs do.

    Every job runs as the same uid (JOB_UID), so what keeps users apart on a writable one is that a container
    mounts its owner's folder alone: a folder the console makes and checks is no link, above which no job
    ever sees anything."""

    name = models.SlugField(max_length=64, unique=True)
    path = models.CharField(max_length=255, unique=True,
                            help_text=_("Absolute, and the same on every node of the pools, e.g. /mnt/datasets."))
    pools = models.ManyToManyField(ResourcePool, blank=True, related_name="shared_paths",
                                   help_text=_("The pools whose nodes mount it (none: every pool)."))
    writable = models.BooleanField(default=False, help_text=_(
        "Jobs may write here, each user in a folder of their own (user-3-alice), which is all of it their jobs see; "
        "the folder must be root's (on a Slurm pool without root, its Slurm user's) and writable by no one else. "
        "Unticked, every job of its pools reads all of it, the users' folders included, and none writes."))
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["path"]

    def __str__(self) -> str:
        return f"{self.name} ({self.path})"

    def clean(self) -> None:
        if not shared_path_is_acceptable(self.path):
            raise ValidationError({"path": _("Give an absolute folder, written plainly, below one of %(roots)s.")
                                   % {"roots": ", ".join(settings.SHARED_PATH_ROOTS)}})
        # One inside another would be mounted whole by a job of the outer one: a writable one's users' folders
        # with it, whatever the inner one's say.
        others = SharedPath.objects.exclude(pk=self.pk).values_list("path", flat=True)
        overlapping = next((other for other in others if self.path.startswith(other + "/")
                            or other.startswith(self.path + "/")), None)
        if overlapping:
            raise ValidationError({"path": _("It overlaps the shared file system at %(other)s: give paths apart.")
                                   % {"other": overlapping}})

    def user_folder(self, user_id: int, username: str) -> str:
        """The user's own folder in a writable one: the part of it their jobs see."""
        return f"{self.path}/user-{user_slug(user_id, username)}"

    @classmethod
    def covering(cls, path: str, pool_id: int | None) -> "SharedPath | None":
        """The shared file system a path in the container lies in, for a job of this pool (no pool: only one
        every pool mounts, since any node may run it)."""
        return next((shared for shared in usable_in_pool(cls.objects.all(), pool_id, any_without_pool=False)
                     if path == shared.path or path.startswith(shared.path + "/")), None)


def shared_path_is_acceptable(path: str) -> bool:
    """A folder below one of SHARED_PATH_ROOTS, written plainly (no "..", no trailing "/", nothing a volume
    option could be read from), and clear of the system's folders and the jobs' own work root."""
    if not path.startswith("/") or posixpath.normpath(path) != path or any(char in path for char in ":,\\") \
            or any(char.isspace() or not char.isprintable() for char in path):
        return False
    if not any(path.startswith(root.rstrip("/") + "/") for root in settings.SHARED_PATH_ROOTS):
        return False
    forbidden = (*FORBIDDEN_SHARED_ROOTS, settings.NODE_WORK_ROOT.rstrip("/"))
    return not any(path == root or path.startswith(root + "/") or root.startswith(path + "/") for root in forbidden)


class Node(models.Model):
    class State(models.TextChoices):
        READY = "Ready", _("Ready")
        NOT_READY = "NotReady", _("NotReady")

    class DisplayState(models.TextChoices):
        """What an operator sees: health, the administrator's switches and the allocation, in one word."""

        READY = "Ready", _("Ready")
        NOT_READY = "NotReady", _("NotReady")
        BUSY = "Busy", _("Busy")
        DRAINING = "Draining", _("Draining")

    name = models.CharField(max_length=64, unique=True)
    address = models.GenericIPAddressField()
    ssh_port = models.PositiveIntegerField(default=22, validators=[MinValueValidator(1), MaxValueValidator(65535)])
    ssh_user = models.CharField(max_length=32, default="root")
    sealed_private_key = models.TextField(blank=True, editable=False)
    # Pinned on first contact; a node that later shows another key is refused.
    host_key = models.TextField(blank=True)
    spec = models.ForeignKey(ResourceSpec, on_delete=models.PROTECT, related_name="nodes")
    pool = models.ForeignKey(ResourcePool, on_delete=models.PROTECT, related_name="nodes", null=True, blank=True)
    enabled = models.BooleanField(default=True)
    # A draining node finishes the job it has and takes no new one.
    draining = models.BooleanField(default=False)
    labels = models.JSONField(default=dict, blank=True)
    # The health state: set by health checks, and by a teardown that could not clean the node.
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    state_message = models.TextField(blank=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    # What the last successful health check found (GPUs, cores, memory, interfaces, versions).
    health = models.JSONField(default=dict, blank=True, editable=False)
    last_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_check_message = models.TextField(blank=True, editable=False)
    # What bringing the engine images here last did (jobs.runtime.image_prefetch): {"image", "text", "at"}.
    image_transfer = models.JSONField(default=dict, blank=True, editable=False)
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

    @property
    def rootless(self) -> bool:
        """A node of a Slurm pool that runs without root: the console reaches it as the Slurm user only."""
        pool = self.pool
        return bool(pool and pool.is_slurm and not pool.slurm_root_ssh)

    @property
    def work_root(self) -> str:
        """Where jobs' folders go on this node when it is not the console's (NODE_WORK_ROOT is root's)."""
        pool = self.pool
        return pool.slurm_work_root if pool and self.rootless else ""

    def ssh_target(self) -> SshTarget:
        """How the console reaches the node itself (as its administrator account, with the node's key)."""
        return SshTarget(label=self.name, address=self.address, port=self.ssh_port, username=self.ssh_user,
                         private_key=self.private_key, host_key=self.host_key)

    @property
    def display_state(self) -> str:
        if not self.enabled or self.state != self.State.READY:
            return self.DisplayState.NOT_READY
        if self.draining:
            return self.DisplayState.DRAINING
        if self.allocated_to_id:
            return self.DisplayState.BUSY
        return self.DisplayState.READY

    @property
    def display_state_reason(self) -> str:
        if not self.enabled:
            return str(_("disabled by an administrator"))
        if self.state != self.State.READY:
            return self.state_message
        if self.draining:
            return str(_("draining: takes no new job"))
        return ""


class Engine(models.Model):
    name = models.CharField(max_length=64, unique=True)

    def __str__(self) -> str:
        return self.name


class EngineVersion(models.Model):
    engine = models.ForeignKey(Engine, on_delete=models.CASCADE, related_name="versions")
    version = models.CharField(max_length=128)
    # What a worker of this engine version runs in; an admin may name any image the nodes can load or pull.
    image = models.CharField(
        max_length=512, blank=True,
        help_text=_("The image each worker's container starts from, e.g. localhost/training-console/mpi:<tag> "
                    "(built by the console) or registry.example.com/horovod:0.28.1-cuda12. It must hold python, "
                    "Open MPI's orted and mpirun, and OpenSSH's sshd, and an account ma-user with uid 1000."))
    python = models.CharField(max_length=256, default="python",
                              help_text=_("Interpreter that runs the boot file: the image's own `python` by default."))
    default_env = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["engine__name", "version"]
        constraints = [models.UniqueConstraint(fields=["engine", "version"], name="unique_engine_version")]

    def __str__(self) -> str:
        return f"{self.engine.name} {self.version}"


NEW_JOBS_ONLY = _("Applies to jobs created after the change; a job keeps what it was launched with.")


class LauncherDefaults(models.Model):
    """The admin-editable defaults a job copies when it is created (a job keeps what it launched with)."""

    bind_args = models.CharField("OPENMPI_BIND_ARGS", max_length=512, default="-bind-to none -map-by slot", blank=True,
                                 help_text=NEW_JOBS_ONLY)
    x_args = models.CharField(
        "OPENMPI_X_ARGS",
        max_length=1024,
        default=(
            "-x LD_LIBRARY_PATH -x HOROVOD_MPI_THREADS_DISABLE=1 -x NCCL_DEBUG=INFO "
            "-x NCCL_SOCKET_IFNAME=ib0,bond0,eth0 -x NCCL_SOCKET_FAMILY=AF_INET -x NCCL_IB_DISABLE=0"
        ),
        blank=True,
        help_text=NEW_JOBS_ONLY,
    )
    mca_args = models.CharField("OPENMPI_MCA_ARGS", max_length=1024, blank=True, help_text=NEW_JOBS_ONLY,
                                default="-mca pml ob1 -mca btl ^openib -mca plm_rsh_no_tree_spawn true")
    tune_prefixes = models.CharField(
        max_length=256,
        default="MA_,SHARED_,S3_,PATH,VC_WORKER_,SCC,CRED",
        help_text=_("Comma-separated name prefixes of worker-0's variables passed to every worker through the tune file."),
    )
    sshd_port_min = models.PositiveIntegerField(default=30000, validators=[MinValueValidator(1024), MaxValueValidator(65535)])
    sshd_port_max = models.PositiveIntegerField(default=30999, validators=[MinValueValidator(1024), MaxValueValidator(65535)])
    # The reference platform stops storing a job's output near 1 GiB; the job itself keeps running.
    log_cap_bytes = models.PositiveBigIntegerField(
        default=1024**3,
        help_text=_("Bytes of a job's output stored before the rest is dropped, with a note in the log (0: no cap). "
                    "Applies to jobs created after the change."),
    )
    # A rank silent this long makes a job "suspected hung"; a job may set its own, else it follows this one.
    watchdog_seconds = models.PositiveIntegerField(
        default=1800,
        help_text=_("Seconds a rank may print nothing before its job is marked suspected hung (0: no watchdog). "
                    "A job that chose no time of its own follows this value while it runs, a change included."),
    )
    watchdog_may_stop = models.BooleanField(
        default=False, help_text=_("Let the console stop a job the watchdog marks as suspected hung, for jobs that "
                                   "chose nothing themselves (a job may ask to be stopped, or only warned).")
    )
    extra_options_allowed = models.TextField(
        blank=True,
        help_text=_("mpirun options users may give in OPENMPI_EXTRA_ARGS beyond the built-in list, one per line: "
                    "the option alone for a flag, or the option and a regular expression its value must match, "
                    "e.g. '--display-topo', '--timeout [0-9]+' or, for an MCA parameter, '--mca coll_hcoll_enable [01]' "
                    "(the expression matches the name and the value)."),
    )
    outputs_max_bytes = models.PositiveBigIntegerField(
        default=1024**3,
        help_text=_("Bytes of a job's output directory (train_url on worker-0) the console keeps when the job ends. "
                    "Applies to jobs created after the change."),
    )
    checkpoint_grace_max_seconds = models.PositiveIntegerField(
        default=600, validators=[MaxValueValidator(86400)],
        help_text=_("The longest notice a job may ask for before a stop: seconds its ranks get to save a checkpoint."),
    )
    debug_hold_max_minutes = models.PositiveIntegerField(
        default=60, validators=[MaxValueValidator(24 * 60)],
        help_text=_("The longest a failed job may keep its containers and nodes for a look inside (minutes)."),
    )
    job_allowed_destinations = models.TextField(
        blank=True,
        help_text=_("Where a job's containers may connect beyond the job's own workers, one destination a line: "
                    "an address or network, then optionally a port or a range, e.g. '10.20.0.0/16' (object "
                    "storage), '192.0.2.10 5000' (a registry), '192.0.2.53 53' (DNS). Everything else, the "
                    "console and other jobs' nodes included, is refused. Applies to jobs started after the change."),
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "launcher defaults"

    def __str__(self) -> str:
        return "Launcher defaults"

    def clean(self) -> None:
        errors: dict[str, str | StrPromise] = {}
        # The administrator's own options are not held to the users' allow-list, only to what holds for
        # everyone: no option the platform sets, no reserved MCA or variable name, shell-safe MCA values.
        for field in ("bind_args", "x_args", "mca_args"):
            try:
                check_mpirun_options(field, getattr(self, field))
            except CommandError as error:
                errors[field] = error.message
        try:
            allowed_options(self.extra_options_allowed)
        except CommandError as error:
            errors["extra_options_allowed"] = error.message
        try:
            parse_allowed_destinations(self.job_allowed_destinations)
        except PolicyError as error:
            errors["job_allowed_destinations"] = str(error)
        prefixes = [prefix.strip() for prefix in self.tune_prefixes.split(",")]
        if any(not ENV_NAME_RE.match(prefix) for prefix in prefixes):
            errors["tune_prefixes"] = _("Give variable-name prefixes separated by commas, such as MA_,PATH.")
        if self.sshd_port_min and self.sshd_port_max and self.sshd_port_min > self.sshd_port_max:
            errors["sshd_port_max"] = _("The range ends before it starts.")
        if errors:
            raise ValidationError(errors)
        self.tune_prefixes = ",".join(prefixes)

    @classmethod
    def current(cls) -> "LauncherDefaults":
        defaults, _ = cls.objects.get_or_create(pk=1)
        return defaults


class CodeDirectory(models.Model):
    class Sharing(models.TextChoices):
        PRIVATE = "private", _("Only its owner")
        EVERYONE = "everyone", _("Everyone")
        GROUP = "group", _("A group")

    # Unique per owner, not across users: a name taken by someone else's private directory must not tell
    # that it exists. The shipped examples (no owner) are unique among themselves.
    name = models.CharField(max_length=64)
    path = models.CharField(max_length=1024)
    file_count = models.PositiveIntegerField(default=0)
    size_bytes = models.PositiveBigIntegerField(default=0)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    # Who besides its owner may list it and run it: nobody (the default), everyone, or one group.
    sharing = models.CharField(max_length=16, choices=Sharing.choices, default=Sharing.PRIVATE)
    shared_with = models.ForeignKey("auth.Group", on_delete=models.SET_NULL, null=True, blank=True,
                                    related_name="code_dirs")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="code_dir_name_unique_per_owner"),
            models.UniqueConstraint(fields=["name"], condition=models.Q(owner__isnull=True),
                                    name="code_dir_name_unique_among_examples"),
        ]

    def __str__(self) -> str:
        return self.name


class IllegalTransition(Exception):
    pass


# Sent once a job's change of state is committed, with `job_id` and `status`: the later stages listen
# (the live progress channel, the end notification; jobs.apps connects them), the models import none of them.
job_state_changed = Signal()


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
    # Back to the queue: auto restart of a failed attempt; a Slurm job that Slurm requeued (preempted, or a
    # node lost) while the console was ending its containers (requeue_after_slurm, only by Slurm's stop).
    JobStatus.PENDING: {JobStatus.CREATING, JobStatus.RUNNING, JobStatus.TERMINATING},
    JobStatus.CREATING: {JobStatus.PENDING},
    JobStatus.RUNNING: {JobStatus.CREATING},
    JobStatus.COMPLETED: {JobStatus.RUNNING},
    JobStatus.FAILED: {JobStatus.PENDING, JobStatus.CREATING, JobStatus.RUNNING},
    JobStatus.TERMINATING: {JobStatus.CREATING, JobStatus.RUNNING},
    JobStatus.TERMINATED: {JobStatus.PENDING, JobStatus.TERMINATING},
    JobStatus.ABNORMAL: {JobStatus.PENDING, JobStatus.CREATING, JobStatus.RUNNING, JobStatus.TERMINATING},
}


class RunOutcome(models.TextChoices):
    """How a job's run on the nodes ended, before it is turned into the job's final state."""

    EXIT = "exit", "mpirun exited"
    FAILED = "failed", "failed before the launch"
    ABNORMAL = "abnormal", "ended abnormally"
    STOPPED = "stopped", "stopped"


class WatchdogAction(models.TextChoices):
    """What the watchdog does with a job it suspects hangs (LauncherDefaults.watchdog_may_stop is everyone's default)."""

    WARN = "warn", _("Only warn")
    STOP = "stop", _("Stop the job")


# In TrainingJob.rank_exit_grace_seconds: a rank's end never fails the job (None is the setting's default).
RANK_EXIT_NEVER = -1
# A job's detail (the API's, the page's table) holds its newest checkpoints only; the rest are a list of their own.
CHECKPOINTS_IN_DETAIL = 20


class StopReason(models.TextChoices):
    USER = "", _("Stopped by the user")
    AUTO_STOP = "auto_stop", _("Stopped by auto stop")
    WATCHDOG = "watchdog", _("Stopped by the watchdog")
    SLURM = "slurm", _("Ended by Slurm")


# The slurm_state the console keeps for a Slurm job that Slurm no longer knows (purged, or never seen), and
# for one Slurm put back in its queue (a preemption or a lost node, with --requeue) while the job ran.
SLURM_VANISHED = "VANISHED"
SLURM_REQUEUED = "REQUEUED"
# ...and for one Slurm is preempting: it keeps running for the preemption's grace (the QOS's or partition's
# GraceTime), then Slurm requeues it; the console stops it at once so that its ranks get their notice.
SLURM_PREEMPTING = "PREEMPTING"


# How far back a chain of Rebuilds that resume is followed for a checkpoint.
MAX_RESUME_CHAIN = 10


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
    # The log cap the job runs with (copied from LauncherDefaults; taken when its log starts if not set),
    # the bytes of output it counts, and the output lines it kept out once reached.
    log_cap_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    # The bytes of train_url the console keeps when the job ends, copied from LauncherDefaults when it was created,
    # so that an administrator's later change leaves the jobs already submitted as they were.
    outputs_max_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    log_bytes = models.PositiveBigIntegerField(default=0)
    log_lines_dropped = models.PositiveBigIntegerField(default=0)
    # Touched every few seconds by the run that owns the job; a stale one means that run is gone.
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    # Results that explain themselves (see jobs.results and jobs.runtime.monitor).
    # Metric definitions ({name, regex}) the job's log is read with, and each metric's last value.
    metric_definitions = models.JSONField(default=list, blank=True)
    final_metrics = models.JSONField(default=dict, blank=True)
    # Seconds a rank may be silent before the job is suspected hung (0: no watchdog), and whether the watchdog then
    # stops the job; each None when its user chose nothing: the administrator's default, read while the job runs.
    watchdog_seconds = models.PositiveIntegerField(null=True, blank=True)
    watchdog_action = models.CharField(max_length=8, choices=WatchdogAction.choices, null=True, blank=True)
    # Seconds the job may go on after a rank ended not as 0 (or raised) while the others wait, before it fails:
    # 0 fails it at once, RANK_EXIT_NEVER never, None takes the RANK_EXIT_GRACE_SECONDS setting when it is needed.
    rank_exit_grace_seconds = models.IntegerField(null=True, blank=True, validators=[MinValueValidator(RANK_EXIT_NEVER)])
    # Set while the watchdog suspects the job hangs; silent_ranks lists {rank, worker, node, silent_since, last_line}.
    suspected_hung_since = models.DateTimeField(null=True, blank=True)
    silent_ranks = models.JSONField(default=list, blank=True)
    # Who asked a stopped job to stop: the user (blank), auto stop, or the watchdog.
    stop_reason = models.CharField(max_length=16, choices=StopReason.choices, blank=True, default=StopReason.USER)
    # The "why it failed" card (jobs.results.failure_card), empty for a job that did not fail.
    failure = models.JSONField(default=dict, blank=True)
    # The job ended and its owner has not been notified yet (see jobs.notifications).
    end_notice_pending = models.BooleanField(default=False)
    # What the teardown found on each node: {checked_at, clean, workers: [{worker, node, clean, processes_left, problem}]}.
    cleanup_report = models.JSONField(default=dict, blank=True)
    # What became of train_url: {state, message, kept_files, kept_bytes, total_files, total_bytes, limit_bytes}.
    outputs_summary = models.JSONField(default=dict, blank=True)
    # The console process following the run ("host:pid:nonce"); another takes the run over only once
    # this one's heartbeat is stale, so a run is followed by one process at a time.
    run_owner = models.CharField(max_length=160, blank=True, editable=False)
    # How far the run's output files in worker-0's container are stored: per stream, the byte offset
    # and the reader's state there (jobs.runtime.mpirun_output), updated with the lines it covers.
    launch_cursor = models.JSONField(default=dict, blank=True, editable=False)
    # A client's retry of the same submission (the Idempotency-Key header, the form's token) returns this job.
    idempotency_key = models.CharField(max_length=128, blank=True, editable=False)
    # Auto restart: how often a job that failed for a restartable reason is run again, and how often it was.
    max_restarts = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(3)])
    # Bring an object-store train_url's files back into the output folder before each start (the reference's
    # "predownload"): a program resumes from the checkpoint it left there.
    predownload = models.BooleanField(default=False)
    restart_count = models.PositiveSmallIntegerField(default=0)
    # The checkpoint contract (jobs.launch.checkpoint_contract): before a stop the console decides, every rank
    # gets checkpoint_signal and checkpoint_grace_seconds to save a checkpoint (0: no notice).
    checkpoint_grace_seconds = models.PositiveIntegerField(default=0)
    checkpoint_signal = models.CharField(max_length=8, default=DEFAULT_NOTICE_SIGNAL,
                                         choices=[(name, f"SIG{name}") for name in NOTICE_SIGNALS])
    # A Rebuild that resumes: the job whose newest checkpoint this one starts from (its own come first once made).
    resume_source = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # Rebuild: the job this one was rebuilt from (its family is the chain of these), whether or not it resumes.
    rebuilt_from = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="rebuilds")
    # After a failure, keep the containers and nodes this many minutes for a look inside (0: tear down at once);
    # held_until is when such a hold ends, while it lasts.
    debug_hold_minutes = models.PositiveIntegerField(default=0)
    held_until = models.DateTimeField(null=True, blank=True, editable=False)
    # When this attempt's notice went out (a checkpoint saved after it says how long it took).
    notice_sent_at = models.DateTimeField(null=True, blank=True, editable=False)
    # When a stop must be over because its nodes are taken back then (Slurm's preemption grace ends): the
    # notice is cut short to leave the teardown its time. None: the stop takes the job's whole grace.
    notice_ends_by = models.DateTimeField(null=True, blank=True, editable=False)
    # The last log sequence number before each attempt after the first: attempt N's lines follow entry N-2.
    attempt_log_starts = models.JSONField(default=list, blank=True, editable=False)
    # A job of a Slurm pool: its Slurm job (one for all its attempts: Slurm requeues it), Slurm's state and
    # why it waits in words, whether its allocation was given back, and what slurmdbd accounted.
    slurm_job_id = models.PositiveBigIntegerField(null=True, blank=True, editable=False)
    slurm_state = models.CharField(max_length=32, blank=True, editable=False)
    slurm_reason = models.CharField(max_length=256, blank=True, editable=False)
    slurm_released = models.BooleanField(default=False, editable=False)
    # Slurm's restart count of its job when the console took its nodes: a higher one while the job runs means
    # Slurm requeued and started it again meanwhile (a preemption the watch did not see, Slurm being away).
    slurm_restarts = models.PositiveIntegerField(default=0, editable=False)
    slurm_accounting = models.JSONField(default=dict, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        # The lists' order, so a page is read off the index rather than sorted (100,000 jobs: see bench/).
        indexes = [models.Index(fields=["-created_at", "-id"], name="job_list_order")]
        constraints = [
            models.UniqueConstraint(fields=["owner", "idempotency_key"], condition=~models.Q(idempotency_key=""),
                                    name="unique_submission_key"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    @property
    def attempt(self) -> int:
        return self.restart_count + 1

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATES

    @property
    def newest_checkpoints(self) -> "models.QuerySet[Checkpoint]":
        return self.checkpoints.all()[:CHECKPOINTS_IN_DETAIL]

    @property
    def may_have_containers(self) -> bool:
        """Whether the job has, or may come to have, containers a terminal opens in (not over, or held)."""
        return not self.is_final or self.is_held_for_debugging

    @property
    def is_held_for_debugging(self) -> bool:
        """A failed job whose containers and nodes are still kept for a look inside."""
        return self.held_until is not None and self.held_until > timezone.now()

    @property
    def can_stop(self) -> bool:
        return self.status in STOPPABLE_STATES

    @property
    def dns_name(self) -> str:
        """A hostname-safe form of the job's name (names may hold `_`, hostnames may not)."""
        import re

        slug = re.sub(r"[^a-z0-9-]+", "-", self.name.lower()).strip("-")[:40] or "job"
        return f"{slug}-{self.pk}"

    def launch_values(self) -> JobValues:
        """What the launch plan needs of this job, as plain values (jobs.launch.plan is computed from these)."""
        spec = self.spec
        resume = self.resume_checkpoint()
        return JobValues(
            job_id=self.pk or 0,
            dns_name=self.dns_name,
            spec=SpecValues(cpu_cores=spec.cpu_cores, memory_gb=spec.memory_gb, gpu_count=spec.gpu_count,
                            processes_per_node=spec.processes_per_node, disk_gb=spec.disk_gb),
            node_count=self.node_count,
            image=self.engine_version.image,
            python=self.engine_version.python,
            code_dir_name=self.code_dir.name,
            code_dir_path=self.code_dir.path,
            boot_file=self.boot_file,
            sshd_port=self.sshd_port or 0,
            parameters=self.parameter_pairs(),
            env={str(name): str(value) for name, value in self.env.items()},
            engine_env={str(name): str(value) for name, value in self.engine_version.default_env.items()},
            restart_count=self.restart_count,
            bind_args=self.bind_args,
            x_args=self.x_args,
            mca_args=self.mca_args,
            extra_args=self.extra_args,
            tune_prefixes=tuple(prefix for prefix in self.tune_prefixes.split(",") if prefix),
            shared_mounts=self.shared_mounts(),
            predownload=self.predownload,
            checkpoint_grace_seconds=self.checkpoint_grace_seconds,
            checkpoint_signal=self.checkpoint_signal,
            resume_from=resume.path if resume else "",
            resume_url=resume.url if resume else "",
        )

    def resume_checkpoint(self) -> "Checkpoint | None":
        """The checkpoint the next attempt starts from: the newest of this job's, or of the job it was rebuilt
        to resume (the same owner's only)."""
        sources = [self.pk] if self.pk else []
        source_id = self.resume_source_id
        # A Rebuild of a Rebuild that saved nothing itself resumes from what its own source resumed from.
        for _level in range(MAX_RESUME_CHAIN):
            if not source_id or source_id in sources:
                break
            sources.append(source_id)
            source_id = TrainingJob.objects.filter(pk=source_id).values_list("resume_source_id", flat=True).first()
        if not sources:
            return None
        return (Checkpoint.objects.filter(job_id__in=sources, job__owner_id=self.owner_id)
                .order_by("-saved_at", "-id").first())

    def outputs_limit(self) -> int:
        """The bytes of train_url kept when the job ends: its own, or the admin setting for a job made without one."""
        if self.outputs_max_bytes is not None:
            return self.outputs_max_bytes
        return LauncherDefaults.current().outputs_max_bytes

    def parameter_pairs(self) -> tuple[tuple[str, str], ...]:
        """The program's parameters, in order, as (name, value)."""
        return tuple((str(item["name"]), str(item["value"])) for item in self.parameters)

    def shared_mounts(self) -> SharedMounts:
        """The shared file systems this job's inputs and train_url lie in, each mounted at its own path: a
        read-only one whole, a writable one as the owner's folder alone, writable where train_url is in it."""
        read_only: set[str] = set()
        writable: set[str] = set()
        for name, value in self.parameter_pairs():
            path = location_path(value)
            if not path.startswith("/") or not is_data_location(name):
                continue
            shared = SharedPath.covering(path, self.pool_id)
            if shared is None:
                continue
            if not shared.writable:
                if is_input(name):
                    read_only.add(shared.path)
                continue
            if self.owner_id is None:  # a job not yet anyone's (the form's preview) has no folder there
                continue
            folder = shared.user_folder(self.owner_id, self.owner.get_username())
            if path == folder or path.startswith(folder + "/"):
                (read_only if is_input(name) else writable).add(folder)
        return SharedMounts(read_only=tuple(sorted(read_only - writable)), writable=tuple(sorted(writable)))

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
            # The outbox: written with the end itself, so the owner hears of it even if the broker is away
            # when it is committed (the periodic sweep queues what is still pending).
            fields.setdefault("end_notice_pending", True)
        if message:
            fields["status_message"] = message
        with transaction.atomic():
            updated = TrainingJob.objects.filter(pk=self.pk, status__in=allowed).update(status=to, **fields)
            if not updated:
                current = TrainingJob.objects.filter(pk=self.pk).values_list("status", flat=True).first()
                raise IllegalTransition(f"job {self.pk} cannot go from {current} to {to}")
            JobEvent.objects.create(job_id=self.pk, kind=f"state:{to}", message=message or to)
            # Every change of state, whoever makes it, is told once it is committed (followers, notifications).
            job_id = self.pk
            transaction.on_commit(lambda: job_state_changed.send(sender=TrainingJob, job_id=job_id, status=to))
        self.status = to
        for key, value in fields.items():
            setattr(self, key, value)

    def begin_creating(self) -> None:
        # No heartbeat yet: the run has not started, and may wait in the queue behind busy workers.
        self.transition(JobStatus.CREATING, "Nodes allocated, preparing the containers", heartbeat_at=None)

    def start(self) -> None:
        self.transition(JobStatus.RUNNING, "Training started")

    def finish(self, exit_code: int) -> None:
        if exit_code == 0:
            self.transition(JobStatus.COMPLETED, "Training end with return code: 0", exit_code=0)
        else:
            self.transition(JobStatus.FAILED, f"Training end with return code: {exit_code}", exit_code=exit_code)

    def fail(self, message: str) -> None:
        self.transition(JobStatus.FAILED, message)

    def requeue_for_restart(self, reason: str, log_seq: int) -> None:
        """Auto restart: the failed attempt's nodes are freed by the caller; the job queues again as attempt N+1."""
        attempt = self.restart_count + 2
        self._requeue(f"Restarting (attempt {attempt} of {self.max_restarts + 1}): {reason}", log_seq)

    def requeue_after_slurm(self, reason: str, log_seq: int) -> None:
        """Slurm took the nodes back and queued its job again (a preemption, a node lost): the job waits for Slurm
        to run it as its next attempt, which is not one of the attempts auto restart counts."""
        if self.stop_reason != StopReason.SLURM:
            raise IllegalTransition(f"job {self.pk}: only Slurm's own stop puts a job back in the queue")
        # Slurm requeued its job (or will, once the preemption's grace is over): the same Slurm job runs the next
        # attempt. Otherwise (Slurm ended it: its
        # preemption mode cancels, or it does not requeue on a lost node) the next attempt is submitted anew.
        requeued = self.slurm_state in (SLURM_REQUEUED, SLURM_PREEMPTING)
        again = {} if requeued else {"slurm_job_id": None, "slurm_released": True}
        self._requeue(f"Requeued by Slurm ({reason}): attempt {self.restart_count + 2} waits for Slurm", log_seq,
                      max_restarts=self.max_restarts + 1, stop_reason=StopReason.USER, **again)

    def _requeue(self, message: str, log_seq: int, **fields: object) -> None:
        self.transition(JobStatus.PENDING, message,
                        restart_count=self.restart_count + 1, attempt_log_starts=[*self.attempt_log_starts, log_seq],
                        heartbeat_at=None, run_owner="", launch_cursor={}, started_at=None, exit_code=None,
                        suspected_hung_since=None, silent_ranks=[], failure={}, cleanup_report={}, notice_sent_at=None, notice_ends_by=None,
                        sealed_ssh_key="", host_public_key="", command="", hostfile="", **fields)
        # How each rank of the failed attempt ended is in its card, kept in the restart's event.
        RankOutcome.objects.filter(job_id=self.pk).delete()

    def mark_abnormal(self, message: str) -> None:
        self.transition(JobStatus.ABNORMAL, message)

    def mark_terminated(self) -> None:
        """The end of a stop: the containers are gone. A stop by the console keeps the reason it gave."""
        self.transition(JobStatus.TERMINATED, self.status_message if self.stop_reason else "Stopped by the user")

    def begin_console_stop(self, reason: str, message: str, ends_by: datetime | None = None) -> None:
        """Auto stop, the watchdog and Slurm stop a job as a user would, saying why; `ends_by`: when its nodes
        are taken back (its notice is cut short to fit)."""
        self.transition(JobStatus.TERMINATING, message, stop_reason=reason, notice_ends_by=ends_by)

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


class WorkerState(models.TextChoices):
    ALLOCATED = "Allocated", _("Allocated")
    PREPARING = "Preparing", _("Preparing")
    UPLOADING = "Uploading", _("Uploading")
    READY = "Ready", _("Ready")
    FAILED = "Failed", _("Failed")
    STOPPED = "Stopped", _("Stopped")
    UNCLEAN = "Unclean", _("Unclean")


class Worker(models.Model):
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="workers")
    index = models.PositiveIntegerField()
    node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, related_name="workers")
    node_name = models.CharField(max_length=64)
    address = models.GenericIPAddressField()
    hostname = models.CharField(max_length=128)
    state = models.CharField(max_length=32, choices=WorkerState.choices, default=WorkerState.ALLOCATED)
    message = models.TextField(blank=True)
    # The container's first process on the node, as the node sees it; ending it ends the container.
    container_pid = models.PositiveIntegerField(null=True, blank=True)
    # The worker's container, by its own unique name (never by a kernel number, which is reused).
    container_name = models.CharField(max_length=128, blank=True)

    class Meta:
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="unique_worker_index")]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        return f"worker-{self.index}"

    def launch_values(self) -> WorkerValues | None:
        """This worker and its node as the launch plan takes them; None once its node is gone."""
        node = self.node
        if node is None:
            return None
        return WorkerValues(index=self.index, address=self.address, hostname=self.hostname, node=node.ssh_target(),
                            container_name=self.container_name, node_gpu_count=len(node.health.get("gpus") or []),
                            node_has_cdi=bool(node.health.get("cdi")), rootless=node.rootless,
                            work_root=node.work_root)


def workers_launch_values(workers: Iterable[Worker]) -> list[WorkerValues]:
    """The launch plan's view of a job's workers (ordered as given), those whose node is gone left out."""
    return [values for worker in workers if (values := worker.launch_values()) is not None]


class JobEvent(models.Model):
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=64)
    message = models.TextField()

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


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

    def __str__(self) -> str:
        return f"line {self.seq} of job {self.job_id}"


class RankOutcome(models.Model):
    """How one rank of a job ended, as its fork agent recorded it in its container (see node_scripts/rank-agent.sh)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="rank_outcomes")
    rank = models.PositiveIntegerField()
    worker_index = models.PositiveIntegerField()
    node_name = models.CharField(max_length=64, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    signal = models.PositiveIntegerField(null=True, blank=True)
    # The signal the rank was sent before it ended (mpirun's abort of the other ranks, or a stop), if any.
    stop_signal = models.CharField(max_length=8, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "rank"]
        constraints = [models.UniqueConstraint(fields=["job", "rank"], name="unique_rank_outcome")]

    def __str__(self) -> str:
        return f"rank {self.rank} of job {self.job_id}"


class MetricPoint(models.Model):
    """One value of a job's metric, read from a log line (`seq`) of one rank, at a step or only a time."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="metric_points")
    name = models.CharField(max_length=64)
    rank = models.PositiveIntegerField(null=True, blank=True)
    step = models.BigIntegerField(null=True, blank=True)
    value = models.FloatField()
    at = models.DateTimeField()
    seq = models.PositiveBigIntegerField()

    class Meta:
        ordering = ["job", "id"]
        indexes = [models.Index(fields=["job", "name", "id"], name="metric_point_series")]

    def __str__(self) -> str:
        return f"{self.name}={self.value} (rank {self.rank}, step {self.step})"


class OpenUpload(models.Model):
    """A multipart upload of a job's output the console opened and has not yet joined or aborted. Kept so that
    one a console process left open when it died (its parts take room in the user's bucket until the store's
    own expiry, where one is set) is aborted by the next upload of the job's output, whichever process runs it."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="open_uploads")
    key = models.CharField(max_length=1024)
    upload_id = models.CharField(max_length=1024)
    opened_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.key} ({self.upload_id})"


class Checkpoint(models.Model):
    """A checkpoint a job's program saved (its manifest, see jobs.launch.checkpoint_contract), recorded once
    every file of it was in the store: a point the job's next attempt may resume from."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.PositiveSmallIntegerField()
    step = models.BigIntegerField()
    # Under the checkpoint folder, and the object URL its files are at (train_url/checkpoints/<path>).
    path = models.CharField(max_length=1024)
    url = models.TextField()
    size_bytes = models.PositiveBigIntegerField()
    file_count = models.PositiveIntegerField()
    # When the console found it complete in the store; the program's own time, as it wrote it (if it did).
    saved_at = models.DateTimeField()
    program_time = models.CharField(max_length=64, blank=True)
    # Seconds after the attempt's notice (None: saved before any notice).
    after_notice_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["job", "-saved_at", "-id"]
        indexes = [models.Index(fields=["job", "-saved_at"], name="checkpoint_newest")]

    def __str__(self) -> str:
        return f"step {self.step} ({self.path})"


class Attempt(models.Model):
    """One attempt of a job once it ended, and the work it lost: the time between its last checkpoint (its
    start when it saved none) and its end, times its nodes (and GPUs)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    ended_as = models.CharField(max_length=256, blank=True)
    node_count = models.PositiveIntegerField()
    gpu_count = models.PositiveIntegerField(default=0)
    last_checkpoint_step = models.BigIntegerField(null=True, blank=True)
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    lost_seconds = models.FloatField()
    # Steps between its last checkpoint (its first step, without one) and the last step its log showed (the
    # metrics' steps); None when its log gave no step.
    lost_steps = models.BigIntegerField(null=True, blank=True)
    lost_node_hours = models.FloatField()
    lost_gpu_hours = models.FloatField(default=0.0)

    class Meta:
        ordering = ["job", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="unique_job_attempt")]

    def __str__(self) -> str:
        return f"attempt {self.number} of job {self.job_id}"


class EvidenceBundle(models.Model):
    """What was seen inside a job when it failed or its watchdog fired: each rank's last lines, the live ranks'
    Python stacks, the masked environment, the command and the node facts (a typed JSON document)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="evidence_bundles")
    attempt = models.PositiveSmallIntegerField()
    reason = models.CharField(max_length=32)
    taken_at = models.DateTimeField(default=timezone.now)
    content = models.JSONField(default=dict)

    class Meta:
        ordering = ["job", "taken_at", "id"]

    def __str__(self) -> str:
        return f"evidence of job {self.job_id} ({self.reason})"


class JobOutputFile(models.Model):
    """A file found in a job's train_url at its end; `kept` says whether it fitted in the outputs limit."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="output_files")
    path = models.CharField(max_length=1024)
    size = models.PositiveBigIntegerField()
    kept = models.BooleanField(default=True)

    class Meta:
        ordering = ["job", "path"]
        constraints = [models.UniqueConstraint(fields=["job", "path"], name="unique_output_path")]

    def __str__(self) -> str:
        return self.path


class ApiToken(models.Model):
    """A user's API token, kept only as a digest: the token itself is shown once, when it is made."""

    PREFIX = "tc_"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64)
    # The first characters of the token, so a user can tell their tokens apart.
    start = models.CharField(max_length=12)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["user", "-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.start}…)"

    @staticmethod
    def digest_of(token: str) -> str:
        # A token holds 256 random bits: a plain SHA-256 cannot be searched back, unlike a password's.
        return hashlib.sha256(token.encode()).hexdigest()

    @classmethod
    def issue(cls, user, name: str) -> tuple["ApiToken", str]:
        """A new token for `user`; returns the record and the token, which is never stored."""
        token = cls.PREFIX + secrets.token_urlsafe(32)
        record = cls.objects.create(user=user, name=name, start=token[: len(cls.PREFIX) + 6], digest=cls.digest_of(token))
        return record, token

    @classmethod
    def user_of(cls, token: str):
        """The active user a token belongs to, or None; notes when it was used."""
        record = cls.objects.select_related("user").filter(digest=cls.digest_of(token.strip())).first()
        if record is None or not record.user.is_active:
            return None
        now = timezone.now()
        if record.last_used_at is None or (now - record.last_used_at).total_seconds() > 60:
            cls.objects.filter(pk=record.pk).update(last_used_at=now)
        return record.user


class ResourceSample(models.Model):
    """What one worker's container used at one moment while its job ran (podman stats, as the node reports it)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="resource_samples")
    worker_index = models.PositiveIntegerField()
    at = models.DateTimeField()
    # Of one core: 250 is two and a half cores busy.
    cpu_percent = models.FloatField()
    memory_bytes = models.PositiveBigIntegerField()
    memory_limit_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    # Where the worker has GPUs: their mean utilisation and the memory they hold, summed.
    gpu_percent = models.FloatField(null=True, blank=True)
    gpu_memory_bytes = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["job", "at", "worker_index"]
        indexes = [models.Index(fields=["job", "at"], name="resource_sample_series")]

    def __str__(self) -> str:
        return f"worker-{self.worker_index} of job {self.job_id} at {self.at:%H:%M:%S}"


class Webhook(models.Model):
    """Where a user is told that a job of theirs ended: an HTTPS (or local HTTP) URL, called with a signed body."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhook")
    url = models.URLField(max_length=500)
    # Signs each call (HMAC-SHA256 of the body); shown once to its owner, like an API token, and kept sealed.
    sealed_secret = models.TextField(editable=False)
    on_failure_only = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_called_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_result = models.CharField(max_length=200, blank=True, editable=False)

    def __str__(self) -> str:
        return f"{self.user}: {self.url}"


class ConsoleProcess(models.Model):
    """What is known of one of the console's Celery processes: when it last gave a sign of life (beat: its
    heartbeat task ran; a worker: it answered `runconsole`'s ping) and its last restart for being silent.

    In the database rather than Redis: the pages already read it, it outlives a Redis restart, and beat's
    heartbeat writes one row every few seconds."""

    class Role(models.TextChoices):
        BEAT = "beat", _("Scheduler (Celery beat)")
        RUNS_WORKER = "worker-runs", _("Worker of the runs queue")
        CONTROL_WORKER = "worker-control", _("Worker of the control queue")
        SHELLS_WORKER = "worker-shells", _("Worker of the shells queue")

    name = models.CharField(max_length=20, choices=Role.choices, unique=True)
    seen_at = models.DateTimeField(null=True, blank=True)
    restarted_at = models.DateTimeField(null=True, blank=True)
    # How long it had been silent when it was killed.
    restart_silence_seconds = models.PositiveIntegerField(null=True, blank=True)
    restarts = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.get_name_display()

    @classmethod
    def seen(cls, name: str, at: datetime) -> None:
        cls.objects.update_or_create(name=name, defaults={"seen_at": at})

    @classmethod
    def restarted(cls, name: str, at: datetime, silence_seconds: float) -> None:
        row, _created = cls.objects.get_or_create(name=name)
        cls.objects.filter(pk=row.pk).update(restarted_at=at, restart_silence_seconds=round(silence_seconds),
                                             restarts=models.F("restarts") + 1)
