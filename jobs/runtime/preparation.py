"""Node preparation: one container per worker, on every node of a job at once.

For each worker the console builds a small bundle (the job's home directory with its keys, its
environment, the hostfile and tune file; the container's sshd configuration and /etc/hosts),
uploads it with the job's code over SFTP, and runs start-container.sh on the node as root.
"""

import asyncio
import io
import tarfile
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from jobs.launch.command_builder import HOSTFILE_PATH, TUNE_FILE_PATH
from jobs.launch.plan import JobPlan, WorkerPlan
from jobs.launch.platform_env import RANK_AGENT_PATH
from jobs.runtime.ssh import NodeError, connect, run_checked, upload

NODE_SCRIPTS = Path(__file__).resolve().parent / "node_scripts"
CONTAINER_HOME = "/home/ma-user"
RANK_AGENT = (NODE_SCRIPTS / "rank-agent.sh").read_text()


@dataclass(frozen=True)
class ContainerStarted:
    index: int
    pid: int
    pidns: str


def environment_file(env: dict[str, str]) -> str:
    # sshd reads ~/.ssh/environment as NAME=value lines and takes the value verbatim to the line's end.
    return "".join(f"{name}={value}\n" for name, value in env.items())


def sshd_config(plan: JobPlan, worker: WorkerPlan) -> str:
    return "\n".join(
        [
            f"Port {plan.sshd_port}",
            f"HostKey {worker.workdir}/etc/ssh_host_ed25519_key",
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
            f"PidFile {worker.workdir}/sshd.pid",
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
        _add_text(archive, "etc/hosts", plan.hosts_file)
        _add_text(archive, "etc/sshd_config", sshd_config(plan, worker))
        _add_text(archive, "etc/ssh_host_ed25519_key", plan.host_private_key, 0o600)


def write_code_archive(plan: JobPlan, destination: Path) -> None:
    with tarfile.open(destination, "w") as archive:
        archive.add(plan.code_dir_path, arcname=plan.code_dir_name)


async def _wait_for_port(worker: WorkerPlan, port: int, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(worker.address, port), 2)
            writer.close()
            return
        except (TimeoutError, OSError) as error:
            if asyncio.get_running_loop().time() > deadline:
                raise NodeError(worker.node.label, "starting the container's sshd", f"port {port} never opened") from error
            await asyncio.sleep(0.1)


ProgressCallback = Callable[[int, str, str], Awaitable[None]]


async def prepare_worker(plan: JobPlan, worker: WorkerPlan, code_archive: Path, report: ProgressCallback) -> ContainerStarted:
    try:
        return await _prepare_worker(plan, worker, code_archive, report)
    except NodeError as error:
        await report(worker.index, "Failed", str(error))
        raise


async def _prepare_worker(plan: JobPlan, worker: WorkerPlan, code_archive: Path, report: ProgressCallback) -> ContainerStarted:
    label = worker.node.label
    await report(worker.index, "Preparing", f"preparing worker-{worker.index} on {label} ({worker.address})")
    connection = await connect(worker.node)
    async with connection:
        await run_checked(connection, label, "creating the work directory", ["mkdir", "-p", f"{worker.workdir}/etc"])
        with tempfile.TemporaryDirectory() as scratch:
            bundle = Path(scratch) / "bundle.tar"
            write_worker_bundle(plan, worker, bundle)
            await report(worker.index, "Uploading", f"uploading code to worker-{worker.index}")
            await upload(
                connection,
                label,
                {
                    str(bundle): f"{worker.workdir}/bundle.tar",
                    str(code_archive): f"{worker.workdir}/code.tar",
                    str(NODE_SCRIPTS / "start-container.sh"): f"{worker.workdir}/start-container.sh",
                    str(NODE_SCRIPTS / "stop-container.sh"): f"{worker.workdir}/stop-container.sh",
                },
            )
        output = await run_checked(
            connection,
            label,
            "starting the container",
            ["sh", f"{worker.workdir}/start-container.sh", worker.workdir, worker.hostname, plan.user, str(plan.preferred_uid)],
        )
    facts = dict(part.split("=", 1) for part in output.split() if "=" in part)
    await _wait_for_port(worker, plan.sshd_port)
    await report(worker.index, "Ready", f"worker-{worker.index} container {worker.hostname} is up, sshd on port {plan.sshd_port}")
    return ContainerStarted(worker.index, int(facts["pid"]), facts["pidns"])


async def prepare_all(plan: JobPlan, report: ProgressCallback) -> list[ContainerStarted]:
    """Start every worker's container in parallel; if any fails, raise the first failure after all finish."""
    with tempfile.TemporaryDirectory() as scratch:
        code_archive = Path(scratch) / "code.tar"
        await asyncio.to_thread(write_code_archive, plan, code_archive)
        results = await asyncio.gather(
            *(prepare_worker(plan, worker, code_archive, report) for worker in plan.workers), return_exceptions=True
        )
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        first = failures[0]
        if isinstance(first, NodeError):
            raise first
        raise NodeError("console", "node preparation", repr(first)) from first
    return [result for result in results if isinstance(result, ContainerStarted)]
