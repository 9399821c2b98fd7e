"""The launch plan: everything a job's run needs, computed once from the job and its allocated workers.

Pure: computed from plain values (JobValues, WorkerValues; the models fill them, see
TrainingJob.launch_values), with no SSH, no database and no model in sight. The form's preview, the run on
the nodes, the job pages and any client take the command, each worker's environment and the rank
placement from here, so what a user is shown is what runs. The runtime keeps the plan's command, hostfile
and tune file on the job, and the rank placement with its launch cursor.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from jobs.launch.checkpoint_contract import DEFAULT_NOTICE_SIGNAL, checkpoint_variables
from jobs.launch.command_builder import CommandError, LaunchCommand, LaunchInputs, build_launch_command, split_args
from jobs.launch.data_paths import object_inputs, object_url_of, program_parameters, url_variables
from jobs.launch.platform_env import hosts_file_text, worker_environment


@dataclass(frozen=True)
class SshTarget:
    label: str
    address: str
    port: int
    username: str
    private_key: str
    # One OpenSSH public key line; empty means "trust on first use" (the caller records what was seen).
    host_key: str = ""


@dataclass(frozen=True)
class SpecValues:
    """What a resource spec gives each worker (ResourceSpec)."""

    cpu_cores: int
    memory_gb: int
    gpu_count: int
    processes_per_node: int
    disk_gb: int = 50


@dataclass(frozen=True)
class SharedMounts:
    """Folders of shared file systems a job's containers mount at their own path: read-only (a read-only file
    system whole, or a user's folder in a writable one that only inputs lie in) and writable (a user's folder
    that train_url lies in, which the nodes make where it is missing)."""

    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobValues:
    """What the plan needs of a job, as plain values (TrainingJob.launch_values fills them)."""

    job_id: int
    dns_name: str
    spec: SpecValues
    node_count: int
    image: str
    python: str
    code_dir_name: str
    code_dir_path: str
    boot_file: str
    sshd_port: int = 0
    parameters: tuple[tuple[str, str], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    engine_env: dict[str, str] = field(default_factory=dict)
    restart_count: int = 0
    bind_args: str = ""
    x_args: str = ""
    mca_args: str = ""
    extra_args: str = ""
    tune_prefixes: tuple[str, ...] = ()
    # Shared file systems (the same path on every node) the job's data lies in (jobs.models.SharedPath).
    shared_mounts: SharedMounts = SharedMounts()
    # Bring an object-store train_url's files back before the start (to resume from a checkpoint there).
    predownload: bool = False
    # The checkpoint contract (jobs.launch.checkpoint_contract): the notice before a stop (0 s: none), and
    # the checkpoint this attempt resumes from ("" when none): its path in the checkpoint folder and the
    # object URL it is brought back from.
    checkpoint_grace_seconds: int = 0
    checkpoint_signal: str = DEFAULT_NOTICE_SIGNAL
    resume_from: str = ""
    resume_url: str = ""


@dataclass(frozen=True)
class WorkerValues:
    """One allocated worker and its node, as plain values (Worker.launch_values fills them)."""

    index: int
    address: str
    hostname: str
    node: SshTarget
    container_name: str = ""
    node_gpu_count: int = 0
    node_has_cdi: bool = False
    # A node of a Slurm pool reached as the Slurm user, not root: its containers are rootless Podman's, started
    # by the Slurm job's step (jobs.runtime.slurm_step), and its work folder is that user's (work_root).
    rootless: bool = False
    work_root: str = ""


@dataclass(frozen=True)
class KeyPair:
    private: str
    public: str


def new_key_pair() -> KeyPair:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return KeyPair(private, public.strip())


@dataclass(frozen=True)
class WorkerPlan:
    index: int
    node: SshTarget
    address: str
    hostname: str
    env: dict[str, str]
    workdir: str
    # The worker's container on its node, known by this unique name only.
    container_name: str = ""
    # The node's GPUs the container gets, by their CDI names.
    gpu_devices: tuple[str, ...] = ()
    # Reached as an ordinary user (WorkerValues.rootless): what root did on the node, that user does as the root
    # of its own user namespace (`podman unshare`), and Slurm's step starts the container.
    rootless: bool = False

    @property
    def work_root(self) -> str:
        """The node's folder of jobs' folders this worker's lies in (<work root>/<job>/worker-<i>)."""
        return self.workdir.rsplit("/", 2)[0]


# Every thread of a container takes one of its node's PIDs, and a thread costs so little memory (3,000 take
# about 117 MB) that the memory limit does not stop a thread or fork bomb. A node holds one job, and the
# smallest pid_max a Linux node has is 32,768: at most a quarter of that to the job leaves the node's sshd,
# Podman and the teardown room to fork. 256 per core is room for a rank's OpenMP and data-loading threads.
PIDS_PER_CORE = 256
PIDS_FLOOR = 1024
PIDS_CEILING = 8192


def pids_limit_for(cpu_cores: int, processes_per_node: int) -> int:
    """The most processes and threads a worker's container may hold, from its spec's cores or slots."""
    return min(max(PIDS_PER_CORE * max(cpu_cores, processes_per_node, 1), PIDS_FLOOR), PIDS_CEILING)


@dataclass(frozen=True)
class ContainerLimits:
    """What the spec gives each worker's container: enforced by the container runtime, but for the disk,
    which the worker watch enforces (the nodes' overlay-on-ext4 storage has no quota to give a container)."""

    cpus: int
    memory_bytes: int
    shm_bytes: int
    gpus: int
    pids: int = PIDS_FLOOR
    # What the job's home and the container's writable layer may hold together, on the node's disk.
    disk_bytes: int = 50 * 1024**3


def container_limits(spec: SpecValues) -> ContainerLimits:
    memory = spec.memory_gb * 1024**3
    # /dev/shm (NCCL's and Open MPI's shared memory) is half the memory, as a tmpfs of the node would be.
    return ContainerLimits(cpus=spec.cpu_cores, memory_bytes=memory, shm_bytes=memory // 2, gpus=spec.gpu_count,
                           pids=pids_limit_for(spec.cpu_cores, spec.processes_per_node),
                           disk_bytes=spec.disk_gb * 1024**3)


def gpu_devices_for(gpus_wanted: int, node_gpu_count: int, cdi_available: bool) -> tuple[str, ...]:
    """The CDI devices a worker gets: all the node's GPUs when the spec asks for them all, else the first N."""
    if not gpus_wanted or not cdi_available or not node_gpu_count:
        return ()
    if gpus_wanted >= node_gpu_count:
        return ("nvidia.com/gpu=all",)
    return tuple(f"nvidia.com/gpu={index}" for index in range(gpus_wanted))


def new_container_name(job_id: int, index: int) -> str:
    return f"tc-{job_id}-w{index}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class JobPlan:
    job_id: int
    job_dns: str
    user: str
    preferred_uid: int
    sshd_port: int
    processes_per_node: int
    code_dir_name: str
    code_dir_path: str
    client_private_key: str
    client_public_key: str
    host_private_key: str
    host_public_key: str
    hostfile: str
    tune_file: str
    hosts_file: str
    argv: list[str]
    working_dir: str
    workers: list[WorkerPlan]
    command_template: str = ""
    command: str = ""
    image: str = ""
    limits: ContainerLimits = ContainerLimits(cpus=1, memory_bytes=1024**3, shm_bytes=512 * 1024**2, gpus=0)
    # The worker each rank runs on, by rank: computed once from the mapping options (see rank_workers).
    rank_workers: tuple[int, ...] = ()
    # data_url names an object store: each worker's node fetches it and the container mounts it read-only.
    stages_inputs: bool = False
    # Shared file systems mounted at their own path (JobValues.shared_mounts): read-only, and the owner's
    # folders in writable ones where train_url lies in them.
    read_only_mounts: tuple[str, ...] = ()
    writable_mounts: tuple[str, ...] = ()
    # train_url names an object store and its files come back into the output folder before the start.
    predownloads_output: bool = False
    # train_url names an object store: the program gets MA_CHECKPOINT_DIR, and its checkpoints are recorded.
    keeps_checkpoints: bool = False
    # Seconds between the notice (this signal to every rank) and the end of a stop; 0: no notice.
    checkpoint_grace_seconds: int = 0
    checkpoint_signal: str = DEFAULT_NOTICE_SIGNAL
    # The checkpoint brought back before the start, as its object URL and its path in the checkpoint folder.
    resume_url: str = ""
    resume_from: str = ""

    @property
    def rank_count(self) -> int:
        return len(self.rank_workers)

    def worker_of_rank(self, rank: int) -> int:
        return worker_of_rank(self.rank_workers, rank)

    def node_names(self) -> dict[int, str]:
        return {worker.index: worker.node.label for worker in self.workers}

    def container_target(self, worker: WorkerPlan) -> SshTarget:
        return SshTarget(
            label=f"worker-{worker.index} ({worker.node.label})",
            address=worker.address,
            port=self.sshd_port,
            username=self.user,
            private_key=self.client_private_key,
            host_key=self.host_public_key,
        )


def worker_of_rank(rank_workers: Sequence[int], rank: int) -> int:
    """The worker a rank ran on; a rank outside the plan (never expected) is put on worker-0."""
    return rank_workers[rank] if 0 <= rank < len(rank_workers) else 0


MAP_BY = re.compile(r"^--?map-by$")


def rank_workers(mpirun_options: str, processes_per_node: int, node_count: int) -> tuple[int, ...]:
    """Where mpirun puts each rank, for the hostfile the plan writes (every worker with the same slots).

    `-map-by slot` (the reference's default) fills worker-0's slots first; `-map-by node` deals ranks
    round-robin over the workers. Other policies are taken as slot filling, which is what they do
    with a hostfile of equal slots and one process per slot.
    """
    try:
        words = split_args("mpirun options", mpirun_options)
    except CommandError:
        words = []
    policy = "slot"
    for word, following in zip(words, [*words[1:], ""], strict=False):
        if MAP_BY.match(word):
            policy = following.split(":")[0].lower()
        elif word.startswith(("--map-by=", "-map-by=")):
            policy = word.split("=", 1)[1].split(":")[0].lower()
    per_node = max(processes_per_node, 1)
    total = per_node * max(node_count, 1)
    if policy == "node":
        return tuple(rank % max(node_count, 1) for rank in range(total))
    return tuple(rank // per_node for rank in range(total))


def worker_environment_for(job: JobValues, index: int, addresses: Sequence[str]) -> dict[str, str]:
    """One worker's variables, as its container gets them; the preview and the pages use the same."""
    return worker_environment(
        job_dns=job.dns_name,
        worker_index=index,
        worker_addresses=addresses,
        gpus_per_node=job.spec.gpu_count,
        engine_env=job.engine_env,
        user_env={**job.env, **url_variables(job.parameters)},
        restart_count=job.restart_count,
        checkpoint_env=checkpoint_variables(bool(object_url_of(job.parameters, "train_url")), job.resume_from,
                                            job.checkpoint_grace_seconds, job.checkpoint_signal),
    )


def launch_inputs(job: JobValues, worker_hostnames: list[str], worker0_env: Mapping[str, str]) -> LaunchInputs:
    """What the command builder needs from a job."""
    return LaunchInputs(
        processes_per_node=job.spec.processes_per_node,
        worker_hostnames=worker_hostnames,
        sshd_port=job.sshd_port,
        python=job.python,
        code_dir_name=job.code_dir_name,
        boot_file=job.boot_file,
        parameters=list(program_parameters(job.parameters)),
        worker0_env=dict(worker0_env),
        bind_args=job.bind_args,
        x_args=job.x_args,
        mca_args=job.mca_args,
        extra_args=job.extra_args,
        tune_prefixes=list(job.tune_prefixes),
    )


def job_command(job: JobValues, worker_hostnames: list[str], addresses: Sequence[str]) -> LaunchCommand:
    return build_launch_command(launch_inputs(job, worker_hostnames, worker_environment_for(job, 0, addresses)))


def job_rank_workers(job: JobValues) -> tuple[int, ...]:
    return rank_workers(f"{job.bind_args} {job.extra_args}", job.spec.processes_per_node, job.node_count)


def worker_plans(job: JobValues, workers: Sequence[WorkerValues], work_root: str,
                 environments: Sequence[Mapping[str, str]] | None = None) -> list[WorkerPlan]:
    return [
        WorkerPlan(
            index=worker.index,
            node=worker.node,
            address=worker.address,
            hostname=worker.hostname,
            env=dict(environments[worker.index]) if environments else {},
            workdir=f"{(worker.work_root or work_root).rstrip('/')}/{job.dns_name}/worker-{worker.index}",
            container_name=worker.container_name or new_container_name(job.job_id, worker.index),
            gpu_devices=gpu_devices_for(job.spec.gpu_count, worker.node_gpu_count, worker.node_has_cdi),
            rootless=worker.rootless,
        )
        for worker in workers
    ]


def plan_job(job: JobValues, workers: Sequence[WorkerValues], *, work_root: str, user: str, preferred_uid: int,
             client_key: KeyPair, host_key: KeyPair, rank_placement: Sequence[int] | None = None) -> JobPlan:
    """The plan of a job whose workers are allocated (ordered by index). `rank_placement`: where the ranks
    were put when the run was launched (kept with its cursor), so that a run taken up again places them as
    launched, whatever an administrator changed since."""
    addresses = [worker.address for worker in workers]
    environments = [worker_environment_for(job, worker.index, addresses) for worker in workers]
    command = build_launch_command(launch_inputs(job, [worker.hostname for worker in workers], environments[0]))
    return JobPlan(
        job_id=job.job_id,
        job_dns=job.dns_name,
        user=user,
        preferred_uid=preferred_uid,
        sshd_port=job.sshd_port,
        processes_per_node=job.spec.processes_per_node,
        code_dir_name=job.code_dir_name,
        code_dir_path=job.code_dir_path,
        client_private_key=client_key.private,
        client_public_key=client_key.public,
        host_private_key=host_key.private,
        host_public_key=host_key.public,
        hostfile=command.hostfile,
        tune_file=command.tune_file,
        hosts_file=hosts_file_text(job.dns_name, addresses),
        argv=command.argv,
        working_dir=command.working_dir,
        workers=worker_plans(job, workers, work_root, environments),
        command_template=command.template,
        command=command.expanded,
        rank_workers=tuple(rank_placement) if rank_placement else job_rank_workers(job),
        image=job.image,
        stages_inputs=bool(object_inputs(job.parameters)),
        read_only_mounts=job.shared_mounts.read_only,
        writable_mounts=job.shared_mounts.writable,
        predownloads_output=job.predownload and bool(object_url_of(job.parameters, "train_url")),
        keeps_checkpoints=bool(object_url_of(job.parameters, "train_url")),
        checkpoint_grace_seconds=job.checkpoint_grace_seconds,
        checkpoint_signal=job.checkpoint_signal,
        resume_url=job.resume_url if object_url_of(job.parameters, "train_url") else "",
        resume_from=job.resume_from if object_url_of(job.parameters, "train_url") else "",
        limits=container_limits(job.spec),
    )
