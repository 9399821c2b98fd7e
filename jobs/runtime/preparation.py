"""Node preparation: one container per worker, on every node of a job at once.

For each worker the console builds a small bundle (the job's home directory with its keys, its
environment, the hostfile and tune file, the container's sshd configuration and host key), uploads it
with the job's code over SFTP, lays it out as the job's uid (prepare-workdir.sh), makes sure the node
holds the engine's image, and starts the worker's container from it (jobs.runtime.containers).
"""

import asyncio
import io
import tarfile
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from jobs.launch.command_builder import HOSTFILE_PATH, TUNE_FILE_PATH
from jobs.launch.plan import JobPlan, WorkerPlan
from jobs.launch.platform_env import RANK_AGENT_PATH
from jobs.models import WorkerState
from jobs.runtime.containers import (
    CONTAINER_HOME,
    IMAGE_UNKNOWN,
    JOB_UID,
    SECCOMP_PROFILE,
    as_node_root,
    run_argv,
    seccomp_path,
)
from jobs.runtime.data_in import Staging, stage_inputs
from jobs.runtime.network_policy import apply_policy
from jobs.runtime.node_images import ensure_image
from jobs.runtime.shared_mounts import mount_points_ready
from jobs.runtime.slurm_step import start_in_step
from jobs.runtime.ssh import NodeError, connect, run_checked, upload

NODE_SCRIPTS = Path(__file__).resolve().parent / "node_scripts"
RANK_AGENT = (NODE_SCRIPTS / "rank-agent.sh").read_text()
SEAL_SCRIPT = (NODE_SCRIPTS / "seal-tools.sh").read_text()


@dataclass(frozen=True)
class ContainerStarted:
    index: int
    container_id: str


def environment_file(env: dict[str, str]) -> str:
    # sshd reads ~/.ssh/environment as NAME=value lines and takes the value verbatim to the line's end.
    return "".join(f"{name}={value}\n" for name, value in env.items())


def sshd_config(plan: JobPlan, worker: WorkerPlan) -> str:
    return "\n".join(
        [
            f"Port {plan.sshd_port}",
            f"HostKey {CONTAINER_HOME}/.sshd/ssh_host_ed25519_key",
            f"AuthorizedKeysFile {CONTAINER_HOME}/.ssh/authorized_keys",
            f"AllowUsers {plan.user}",
            "PermitRootLogin no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            # How each worker's platform variables reach the orted that mpirun starts there.
            "PermitUserEnvironment yes",
            "UsePAM no",
            "UseDNS no",
            "PrintMotd no",
            f"PidFile {CONTAINER_HOME}/.sshd/sshd.pid",
            # The console collects the job's outputs over SFTP, seeing paths as the job does.
            "Subsystem sftp internal-sftp",
            "MaxStartups 200:30:400",
            "MaxSessions 200",
            "",
        ]
    )


def known_hosts(plan: JobPlan) -> str:
    lines = []
    for worker in plan.workers:
        for name in (worker.hostname, f"{worker.hostname}.{plan.job_dns}", worker.address):
            lines.append(f"[{name}]:{plan.sshd_port} {plan.host_public_key}")
    return "\n".join(lines) + "\n"


def _add_text(archive: tarfile.TarFile, name: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    archive.addfile(info, io.BytesIO(data))


def write_worker_bundle(plan: JobPlan, worker: WorkerPlan, destination: Path) -> None:
    ssh_config = "Host *\n  IdentityFile ~/.ssh/id_ed25519\n  StrictHostKeyChecking yes\n  UserKnownHostsFile ~/.ssh/known_hosts\n"
    with tarfile.open(destination, "w") as archive:
        _add_text(archive, "home/.ssh/authorized_keys", plan.client_public_key + "\n", 0o600)
        _add_text(archive, "home/.ssh/id_ed25519", plan.client_private_key, 0o600)
        _add_text(archive, "home/.ssh/known_hosts", known_hosts(plan), 0o600)
        _add_text(archive, "home/.ssh/config", ssh_config, 0o600)
        _add_text(archive, "home/.ssh/environment", environment_file(worker.env), 0o600)
        # Every rank reads the tune file at its own node's path, so every worker gets both files.
        _add_text(archive, "home" + HOSTFILE_PATH.removeprefix(CONTAINER_HOME), plan.hostfile)
        _add_text(archive, "home" + TUNE_FILE_PATH.removeprefix(CONTAINER_HOME), plan.tune_file)
        _add_text(archive, "home" + RANK_AGENT_PATH.removeprefix(CONTAINER_HOME), RANK_AGENT, 0o755)
        # The worker's sshd runs as the job's user, from the job's home: nothing of it is the node's.
        _add_text(archive, "home/.sshd/sshd_config", sshd_config(plan, worker))
        _add_text(archive, "home/.sshd/ssh_host_ed25519_key", plan.host_private_key, 0o600)


def write_code_archive(plan: JobPlan, destination: Path) -> None:
    with tarfile.open(destination, "w") as archive:
        archive.add(plan.code_dir_path, arcname=plan.code_dir_name)


# The container's sshd opens its port tens of milliseconds after `podman run` returns; a poll of 0.1 s
# added up to that much to every worker's start (bench/fanout.py times this step).
PORT_POLL_SECONDS = 0.02


async def _wait_for_port(worker: WorkerPlan, port: int, timeout: float = 15.0) -> None:  # noqa: ASYNC109 - a deadline polled 20 ms at a time
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(worker.address, port), 2)
            writer.close()
            return
        except (TimeoutError, OSError) as error:
            if asyncio.get_running_loop().time() > deadline:
                raise NodeError(worker.node.label, "starting the container's sshd", f"port {port} never opened") from error
            await asyncio.sleep(PORT_POLL_SECONDS)


ProgressCallback = Callable[[int, str, str], Awaitable[None]]


async def prepare_worker(plan: JobPlan, worker: WorkerPlan, code_archive: Path, report: ProgressCallback,
                         inputs: Sequence[Staging] = ()) -> ContainerStarted:
    try:
        return await _prepare_worker(plan, worker, code_archive, report, inputs)
    except NodeError as error:
        await report(worker.index, WorkerState.FAILED, str(error))
        raise


async def _prepare_worker(plan: JobPlan, worker: WorkerPlan, code_archive: Path, report: ProgressCallback,
                          inputs: Sequence[Staging]) -> ContainerStarted:
    label = worker.node.label
    await report(worker.index, WorkerState.PREPARING, f"preparing worker-{worker.index} on {label} ({worker.address})")
    if not plan.image:
        raise NodeError("console", "choosing the image", "the job's engine version names no image")
    connection = await connect(worker.node)
    async with connection:
        if worker.rootless:
            if worker.node.username == "root":
                raise NodeError(label, "logging in", "this node of a Slurm pool without root is registered with root's "
                                "login: register it with the pool's Slurm user and that user's key")
            await own_work_root(connection, label, worker.work_root)
        with tempfile.TemporaryDirectory() as scratch:
            bundle = Path(scratch) / "bundle.tar"
            write_worker_bundle(plan, worker, bundle)
            await report(worker.index, WorkerState.UPLOADING, f"uploading code to worker-{worker.index}")
            await upload(connection, label, folder=worker.workdir, files={
                str(bundle): f"{worker.workdir}/bundle.tar",
                str(code_archive): f"{worker.workdir}/code.tar",
                str(NODE_SCRIPTS / "prepare-workdir.sh"): f"{worker.workdir}/prepare-workdir.sh",
                str(SECCOMP_PROFILE): seccomp_path(worker),
            })
        layout = as_node_root(worker, ["sh", f"{worker.workdir}/prepare-workdir.sh", worker.workdir, str(JOB_UID)])

        async def say(text: str) -> None:
            await report(worker.index, WorkerState.PREPARING, text)

        if inputs:
            # What the node fetches goes in while the whole tree is still root's, before home is the job's
            # uid's: root never writes where a process of that uid could have put a link.
            await run_checked(connection, label, "laying out the job's files", [*layout, "layout"])
            for staging in inputs:
                await stage_inputs(connection, worker, staging, say)
            await run_checked(connection, label, "giving the job its files", [*layout, "own"])
        else:
            await run_checked(connection, label, "laying out the job's files", layout)

        await mount_points_ready(connection, plan, worker)
        # The node's network policy is in place before any process of the job runs there.
        await apply_policy(connection, plan, worker, JOB_UID)
        if worker.rootless:
            await ensure_image(connection, label, plan.image, say, cache=f"{worker.work_root}/.image-cache")
            await start_in_step(connection, plan, worker)
            output = worker.container_name
        else:
            output = await _start_container(connection, plan, worker, say)
        await run_checked(connection, label, "sealing the launch's programs",
                          ["sh", "-c", SEAL_SCRIPT, "seal-tools", worker.container_name])
    await _wait_for_port(worker, plan.sshd_port)
    await report(worker.index, WorkerState.READY,
                 f"worker-{worker.index} container {worker.container_name} ({worker.hostname}) is up, sshd on port {plan.sshd_port}")
    return ContainerStarted(worker.index, output.strip()[:64])


async def own_work_root(connection: asyncssh.SSHClientConnection, label: str, work_root: str) -> None:
    """The folder of jobs' folders on a node reached as an ordinary user: made by it, and used only while it is
    that user's own folder and no link (a place like /var/tmp is open to every account of the node)."""
    await run_checked(connection, label, f"making the jobs' folder {work_root}", [
        "sh", "-c", 'mkdir -p -m 711 -- "$1" && [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] && chmod 711 -- "$1" '
        '|| { echo "it is not a folder of this user'"'"'s own" >&2; exit 1; }', "sh", work_root])


async def _start_container(connection: asyncssh.SSHClientConnection, plan: JobPlan, worker: WorkerPlan,
                           say: Callable[[str], Awaitable[None]]) -> str:
    label = worker.node.label
    try:
        return await run_checked(connection, label, "starting the container", run_argv(plan, worker))
    except NodeError as error:
        if IMAGE_UNKNOWN not in error.reason:
            raise
    # Asked only now: a `podman image exists` before every start cost each node a podman process.
    await ensure_image(connection, label, plan.image, say)
    return await run_checked(connection, label, "starting the container", run_argv(plan, worker))


async def prepare_all(plan: JobPlan, report: ProgressCallback, inputs: Sequence[Staging] = ()) -> list[ContainerStarted]:
    """Start every worker's container in parallel (each with its object-store data fetched first, if any);
    if any fails, raise the first failure after all finish."""
    with tempfile.TemporaryDirectory() as scratch:
        code_archive = Path(scratch) / "code.tar"
        await asyncio.to_thread(write_code_archive, plan, code_archive)
        results = await asyncio.gather(
            *(prepare_worker(plan, worker, code_archive, report, inputs) for worker in plan.workers), return_exceptions=True
        )
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        first = failures[0]
        if isinstance(first, NodeError):
            raise first
        raise NodeError("console", "node preparation", f"{type(first).__name__}: {first}" if str(first)
                        else type(first).__name__) from first
    return [result for result in results if isinstance(result, ContainerStarted)]
