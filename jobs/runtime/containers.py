"""The container runtime on a node: Podman, driven over SSH as the node's root, with its argv built here.

Docker's CLI has the same shape, so this is the one module to change for it; Podman (daemonless,
rootful, Debian's package) is the runtime that is tested. A worker's container:
- shares the node's network (`--network host`: InfiniBand and RoCE reach the ranks as on the reference),
  with its own hostname, the job's host names (`--add-host`) and its own PID, mount, IPC and UTS spaces,
  so it sees nothing of the host's or another job's processes, files or /proc;
- has the spec's CPUs, memory and shared memory (`--cpus`, `--memory`, `--shm-size`), a share of the
  node's PIDs (`--pids-limit`, so a thread or fork bomb leaves the node able to fork), and the node's
  GPUs through their CDI names when the spec has GPUs; its disk limit rides on a label, which the worker
  watch reads (jobs.runtime.liveness);
- runs everything as ma-user (uid 1000), capabilities all dropped, no new privileges, under the console's
  seccomp profile (no new namespaces: no user namespace to gain capabilities in), its one bind mount
  (the job's home) `nosuid,nodev`; its first process is an sshd of ma-user's on the job's port, which
  accepts only the job's key.
All processes of a job run as uid 1000 on the host; isolation comes from the namespaces, not from
distinct uids (a user namespace per job is the next step, see README).

On a node of a Slurm pool without root (WorkerPlan.rootless) the same container is the Slurm user's rootless
Podman's: uid 1000 inside is one of that user's subordinate ids outside, the container's root is the user, and
the limits are Slurm's cgroups of the job's step, which the container's are made below (Podman cannot set
them itself without root on these cgroups): `--cpus`, `--memory` and `--pids-limit` are left out there, and the
job's uid gets the same number of processes and threads as its RLIMIT_NPROC.
"""

import shlex
from pathlib import Path

from jobs.launch.data_paths import INPUTS_DIR
from jobs.launch.plan import JobPlan, WorkerPlan

CONTAINER_HOME = "/home/ma-user"
CACHE_DIR = "/cache"
JOB_UID = 1000
LABEL = "training-console.job"
WORKDIR_LABEL = "training-console.workdir"
# The bytes the job's home and the container's writable layer may hold together (worker-usage.sh reads it).
DISK_LIMIT_LABEL = "training-console.disk-limit"
# The GPUs the container was given, as nvidia-smi -i takes them, or NO_GPUS (worker-usage.sh reads it): on a
# Slurm node those of the step, which the plan does not know.
GPUS_LABEL = "training-console.gpus"
NO_GPUS = "none"
# Podman's default seccomp profile less new namespaces (see jobs/runtime/seccomp.py); each worker's
# preparation uploads it beside the job's home, where `podman run` reads it.
SECCOMP_PROFILE = Path(__file__).resolve().parent / "seccomp-job.json"
SSHD_CONFIG = f"{CONTAINER_HOME}/.sshd/sshd_config"
# What `podman run --pull=never` says of an image the node does not hold.
IMAGE_UNKNOWN = "image not known"


def seccomp_path(worker: WorkerPlan) -> str:
    """Where the seccomp profile lies on the worker's node (outside the home the container mounts)."""
    return f"{worker.workdir}/seccomp.json"


def run_argv(plan: JobPlan, worker: WorkerPlan) -> list[str]:
    """`podman run` of the worker's container, with the GPUs the plan gives it."""
    return (run_options(plan, worker) + ["--label", f"{GPUS_LABEL}={gpu_indices(worker.gpu_devices) or NO_GPUS}"]
            + device_options(worker.gpu_devices) + image_command(plan))


def device_options(devices: tuple[str, ...]) -> list[str]:
    return [word for device in devices for word in ("--device", device)]


def gpu_indices(devices: tuple[str, ...]) -> str:
    """The GPUs of CDI names (nvidia.com/gpu=0), as nvidia-smi -i takes them: 0,3."""
    return ",".join(device.rpartition("=")[2] for device in devices if device.rpartition("=")[2].isdigit())


def image_command(plan: JobPlan) -> list[str]:
    return [plan.image, "/usr/sbin/sshd", "-D", "-e", "-f", SSHD_CONFIG]


def run_options(plan: JobPlan, worker: WorkerPlan) -> list[str]:
    """`podman run` and every option of the worker's container but its GPUs (a Slurm step adds the ones it was given)."""
    limits = plan.limits
    # Never pulled here: a node without the image is told so at once, and the preparation brings it.
    argv = ["podman", "run", "--detach", "--pull=never", "--name", worker.container_name,
            "--label", f"{LABEL}={plan.job_id}", "--label", f"training-console.worker={worker.index}",
            "--label", f"{DISK_LIMIT_LABEL}={limits.disk_bytes}",
            # Where the worker's files are on the node: a health check finds what a failed teardown left
            # from the container itself, even once its job (and the job's rows) are gone.
            "--label", f"{WORKDIR_LABEL}={worker.workdir}",
            "--network", "host", "--hostname", worker.hostname]
    for other in plan.workers:
        argv += ["--add-host", f"{other.hostname}.{plan.job_dns}:{other.address}",
                 "--add-host", f"{other.hostname}:{other.address}"]
    if not worker.rootless:
        argv += ["--cpus", str(limits.cpus), "--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes),
                 "--pids-limit", str(limits.pids)]
    else:
        # Slurm's cgroups (v1) count no PIDs: the job's uid gets as many processes and threads as a rlimit instead.
        argv += ["--ulimit", f"nproc={limits.pids}:{limits.pids}"]
    argv += ["--shm-size", str(limits.shm_bytes),
             "--user", f"{JOB_UID}:{JOB_UID}", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
             "--security-opt", f"seccomp={seccomp_path(worker)}",
             "--volume", f"{worker.workdir}/home:{CONTAINER_HOME}:rw,nosuid,nodev",
             # The job's local disk, as the reference gives it at /cache (prepare-workdir.sh).
             "--volume", f"{worker.workdir}/cache:{CACHE_DIR}:rw,nosuid,nodev",
             "--workdir", CONTAINER_HOME]
    if plan.stages_inputs:
        # Root's files, fetched before the start (jobs.runtime.data_in): the job reads them, never changes them.
        argv += ["--volume", f"{worker.workdir}/inputs:{INPUTS_DIR}:ro,nosuid,nodev"]
    for path in plan.read_only_mounts:
        # A shared file system of the node's (jobs.models.SharedPath), read where the job's data_url names it.
        argv += ["--volume", f"{path}:{path}:ro,nosuid,nodev"]
    for path in plan.writable_mounts:
        # The owner's folder in a writable one, where train_url lies (jobs.runtime.shared_mounts made it).
        argv += ["--volume", f"{path}:{path}:rw,nosuid,nodev"]
    return argv


def run_command(plan: JobPlan, worker: WorkerPlan) -> str:
    return shlex.join(run_argv(plan, worker))


def as_node_root(worker: WorkerPlan, argv: list[str]) -> list[str]:
    """argv as it runs with root's say over the worker's files: as root, or on a rootless node as the root of the
    Slurm user's own user namespace (`podman unshare`), where the job's uid 1000 is the one its container has."""
    return node_root_argv(worker.rootless, argv)


def node_root_argv(rootless: bool, argv: list[str]) -> list[str]:
    """as_node_root for a node known by whether it is reached without root (the health check has no worker)."""
    return ["podman", "unshare", *argv] if rootless else argv
