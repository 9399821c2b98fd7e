"""A real Slurm on local nodes (jobs.localslurm), driven through slurmrestd by the console's client: jobs run on
both nodes, wait on a quota with the reason said in words, are cancelled with nothing left, and the instance
comes up once and goes down leaving nothing."""

import ipaddress
import os
import subprocess
import time
from pathlib import Path

import pytest

from jobs import localcluster, localslurm
from jobs.launch.plan import JobValues, SpecValues
from jobs.slurm.batch import PoolValues, batch_request
from jobs.slurm.rest import Credentials, SlurmAuthRefused, SlurmError, SlurmRest, SlurmUnreachable
from jobs.slurm.states import Phase, exit_status, phase_of, reason_words

RUN_ID = int(os.environ.get("TEST_RUN_ID", "0"))
ROOT = Path(f"/var/lib/training-console/test-localslurm-{RUN_ID}")
SUBNET = f"10.80.{RUN_ID}.0/24"
CLUSTER = {"subnet": SUBNET, "bridge": f"tcsl{RUN_ID}br", "prefix": f"tcsl{RUN_ID}n"}
USER = "ma-user"
# A job's files: written by the Slurm user, read by the test (the nodes share this machine's disk).
OUTPUT = Path(f"/var/tmp/test-localslurm-{RUN_ID}")
WAIT_S = 60.0


def bring_up(name: str, cluster: dict[str, str], nodes: int, base_port: int) -> localslurm.LocalSlurm:
    made = localcluster.up(ROOT / name / "cluster", nodes, **cluster)
    namespaces = {entry.name: entry.namespace for entry in localcluster.status(ROOT / name / "cluster")}
    gateway = str(ipaddress.ip_network(cluster["subnet"]).network_address + 1)
    return localslurm.up(ROOT / name / "slurm",
                         [localslurm.SlurmNode(node.name, node.address, namespaces[node.name], 4, 4096) for node in made],
                         controller_address=gateway, cluster=f"test{RUN_ID}{name}", base_port=base_port, users=[USER])


def take_down(name: str, cluster: dict[str, str]) -> None:
    localslurm.down(ROOT / name / "slurm")
    localcluster.down(ROOT / name / "cluster", bridge=cluster["bridge"], prefix=cluster["prefix"])


@pytest.fixture(scope="module")
def slurm():
    take_down("main", CLUSTER)
    OUTPUT.mkdir(mode=0o777, exist_ok=True)
    os.chmod(OUTPUT, 0o777)
    try:
        yield bring_up("main", CLUSTER, 2, 17000 + 10 * RUN_ID)
    finally:
        take_down("main", CLUSTER)
        subprocess.run(["rm", "-rf", str(OUTPUT)], check=False)


@pytest.fixture
def rest(slurm):
    return SlurmRest(slurm.rest_url, Credentials(USER, localslurm.token(slurm.state_dir, USER, 600)))


def values(job_id: int, nodes: int = 2, cpus: int = 1) -> JobValues:
    return JobValues(job_id=job_id, dns_name=f"job-{job_id}", spec=SpecValues(cpus, 1, 0, 1), node_count=nodes,
                     image="unused", python="python3", code_dir_name="code", code_dir_path="/code", boot_file="x.py")


def wait_for(rest: SlurmRest, job_id: int, phases: set[Phase], timeout: float = WAIT_S) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        record = rest.job(job_id)
        assert record is not None, f"Slurm lost job {job_id}"
        if phase_of(record["job_state"]) in phases:
            return record
        assert time.monotonic() < deadline, f"job {job_id} still {record['job_state']} ({record['state_reason']})"
        time.sleep(0.5)


def test_the_rest_server_speaks_the_version_the_client_does(rest):
    assert rest.check_version() == "22.05.8"


def test_a_two_node_job_runs_one_task_on_each_node_and_its_exit_code_is_read(slurm, rest):
    script = f"#!/bin/bash\nsrun bash -c 'echo $SLURMD_NODENAME > {OUTPUT}/nodes-$SLURM_JOB_ID.$SLURM_PROCID'\nexit 3\n"
    job_id = rest.submit(batch_request(values(101), PoolValues(slurm.partition), script, name="t",
                                       account="console"))
    record = wait_for(rest, job_id, {Phase.FAILED, Phase.COMPLETED})
    assert phase_of(record["job_state"]) is Phase.FAILED
    assert exit_status(record.get("exit_code")).code == 3
    seen = sorted(path.read_text().strip() for path in OUTPUT.glob(f"nodes-{job_id}.*"))
    assert seen == ["node-0", "node-1"]
    assert record["nodes"] == "node-[0-1]"
    # slurmdbd has the job once the controller has sent it (asynchronously).
    deadline = time.monotonic() + WAIT_S
    while (accounted := rest.accounting(job_id)) is None or accounted["state"]["current"] != "FAILED":
        assert time.monotonic() < deadline, "slurmdbd never recorded the job's end"
        time.sleep(1)
    assert accounted["account"] == "console"
    assert {tres["type"]: tres["count"] for tres in accounted["tres"]["allocated"]}["node"] == 2


def test_a_job_over_its_accounts_cpu_quota_waits_saying_so_then_runs_when_the_quota_is_lifted(slurm, rest):
    localslurm.sacctmgr(slurm.state_dir, "add", "account", "small", "GrpTRES=cpu=2")
    localslurm.sacctmgr(slurm.state_dir, "add", "user", USER, "Account=small")
    job_id = rest.submit(batch_request(values(102, cpus=2), PoolValues(slurm.partition), "#!/bin/bash\ntrue\n",
                                       name="t", account="small"))
    record = wait_for(rest, job_id, {Phase.WAITING})
    deadline = time.monotonic() + WAIT_S
    while record["state_reason"] in ("None", ""):  # the scheduler's first look gives the reason
        assert time.monotonic() < deadline
        time.sleep(0.5)
        record = wait_for(rest, job_id, {Phase.WAITING})
    assert record["state_reason"] == "AssocGrpCpuLimit"
    assert reason_words(record["state_reason"]) == "your account's quota is in use: Cpu (AssocGrpCpuLimit)"
    localslurm.sacctmgr(slurm.state_dir, "modify", "account", "small", "set", "GrpTRES=cpu=-1")
    assert phase_of(wait_for(rest, job_id, {Phase.COMPLETED, Phase.FAILED})["job_state"]) is Phase.COMPLETED


def tasks_named(name: str) -> int:
    """Processes whose argv[0] is `name` (a task started with `exec -a name`; srun's own line only mentions it)."""
    count = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            count += cmdline.read_bytes().split(b"\0", 1)[0] == name.encode()
        except OSError:
            continue
    return count


def test_a_cancelled_job_ends_cancelled_with_none_of_its_processes_left(slurm, rest):
    marker = f"slurm-cancel-{RUN_ID}"
    script = f"#!/bin/bash\nsrun bash -c 'exec -a {marker} sleep 300'\n"
    job_id = rest.submit(batch_request(values(103), PoolValues(slurm.partition), script, name="t",
                                       account="console"))
    wait_for(rest, job_id, {Phase.RUNNING})
    deadline = time.monotonic() + WAIT_S
    while tasks_named(marker) != 2:
        assert time.monotonic() < deadline, "the job's two tasks never started"
        time.sleep(0.5)
    rest.cancel(job_id)
    assert phase_of(wait_for(rest, job_id, {Phase.CANCELLED})["job_state"]) is Phase.CANCELLED
    deadline = time.monotonic() + WAIT_S
    while tasks_named(marker):
        assert time.monotonic() < deadline, "a task of the cancelled job is still running"
        time.sleep(0.5)
    rest.cancel(job_id)  # cancelling again is no error


def test_an_expired_token_and_a_stopped_rest_server_are_each_said_in_words(slurm):
    expired = SlurmRest(slurm.rest_url, Credentials(USER, localslurm.token(slurm.state_dir, USER, 1)))
    time.sleep(1.5)
    with pytest.raises(SlurmAuthRefused, match="expired at"):
        expired.nodes()
    forged = SlurmRest(slurm.rest_url, Credentials(USER, "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJtYS11c2VyIn0.Zm9yZ2Vk"))
    with pytest.raises(SlurmUnreachable, match="refused the token"):
        forged.check_version()
    with pytest.raises(SlurmError):
        forged.nodes()
    # slurmctld answers a refused token's look at a job "Unable to find JobId": never taken for a job gone.
    job_id = SlurmRest(slurm.rest_url, Credentials(USER, localslurm.token(slurm.state_dir, USER, 60))).submit(
        batch_request(values(104, nodes=1), PoolValues(slurm.partition), "#!/bin/bash\ntrue\n", name="t",
                      account="console"))
    with pytest.raises(SlurmError):
        forged.job(job_id)
    nothing = SlurmRest("http://127.0.0.1:9", Credentials(USER, localslurm.token(slurm.state_dir, USER, 60)), timeout=2)
    with pytest.raises(SlurmUnreachable, match="did not answer"):
        nothing.nodes()


def still_running(pid: int | None, state_dir: Path) -> bool:
    """A daemon of the instance in state_dir still runs: its command line or environment names that folder."""
    try:
        seen = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return str(state_dir).encode() in seen


def test_up_again_restarts_nothing_and_down_leaves_no_daemon_database_nor_folder():
    cluster = {"subnet": f"10.81.{RUN_ID}.0/24", "bridge": f"tcso{RUN_ID}br", "prefix": f"tcso{RUN_ID}n"}
    take_down("once", cluster)
    try:
        first = bring_up("once", cluster, 1, 17005 + 10 * RUN_ID)
        daemons = localslurm.status(first.state_dir)
        assert {daemon.name for daemon in daemons} == {"munged", "slurmdbd", "slurmctld", "slurmd:node-0", "slurmrestd"}
        assert all(daemon.alive for daemon in daemons)
        bring_up("once", cluster, 1, 17005 + 10 * RUN_ID)
        assert localslurm.status(first.state_dir) == daemons
    finally:
        take_down("once", cluster)
    assert [daemon.name for daemon in daemons if still_running(daemon.pid, first.state_dir)] == []
    assert not (ROOT / "once" / "slurm").exists()
    databases = subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-N", "-e", "SHOW DATABASES"],
                               capture_output=True, text=True, check=True).stdout.split()
    assert f"slurm_test{RUN_ID}once" not in databases


@pytest.mark.django_db
def test_the_command_brings_up_a_slurm_pool_the_console_can_use_and_down_removes_its_nodes(settings):
    from django.core.management import call_command

    from jobs.backends.slurm import check_pool
    from jobs.models import Node, ResourcePool

    settings.LOCALSLURM_STATE_DIR = ROOT / "command"
    settings.LOCALSLURM_SUBNET = f"10.85.{RUN_ID}.0/24"
    settings.LOCALSLURM_BRIDGE, settings.LOCALSLURM_PREFIX = f"tcsc{RUN_ID}br", f"tcsc{RUN_ID}n"
    settings.LOCALSLURM_CLUSTER = f"command{RUN_ID}"  # its database apart from the console's own local Slurm's
    settings.LOCALSLURM_BASE_PORT = 17005 + 10 * RUN_ID  # the ports of the test before, which has ended
    try:
        call_command("localslurm", "up", nodes=1, stdout=open(os.devnull, "w"))
        pool = ResourcePool.objects.get(name="slurm")
        # Without root, as a site's pool: its node is reached as the Slurm user.
        assert (pool.backend, pool.slurm_partition, pool.slurm_root_ssh) == ("slurm", "batch", False)
        assert list(Node.objects.filter(pool=pool).values_list("name", "address", "ssh_user")) == [
            ("slurm-0", f"10.85.{RUN_ID}.10", "ma-user")]
        assert check_pool(pool.pk) == "reachable: Slurm 22.05.8, REST API v0.0.38"
    finally:
        call_command("localslurm", "down", stdout=open(os.devnull, "w"))
    assert not Node.objects.filter(pool__name="slurm").exists()
    assert not (ROOT / "command" / "slurm").exists()
