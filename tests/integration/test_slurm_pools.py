"""Jobs of a Slurm pool, end to end: a real Slurm (jobs.localslurm) allocates the local cluster's two nodes, the
console launches on the nodes it gave, Celery beat's watch sees what Slurm does, and Slurm's accounting agrees
with the console's ending. Slurm runs on the same nodes as the console's own tests; for each test the nodes move
into the Slurm pool, so the console's allocator never has them. The pool runs without root, as a Slurm site's
does: the console logs in as the Slurm user only (each test reads the nodes' sshd logs for any root login), and
the batch job's step runs the containers with that user's rootless Podman; one test runs the root option."""

import base64
import ipaddress
import os
import pwd
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from django.test import Client

from console import services
from jobs import localcluster, localslurm
from jobs.allocation import waiting_reason
from jobs.backends.slurm import check_pool
from jobs.code_dirs.service import register_examples
from jobs.images.recipes import HOROVOD, MINDSPORE
from jobs.models import (
    FINAL_STATES,
    Engine,
    EngineVersion,
    JobStatus,
    Node,
    ResourcePool,
    SharedPath,
    StopReason,
    TrainingJob,
)
from jobs.secret_box import seal_secret
from jobs.slurm.rest import Credentials, SlurmRest
from jobs.slurm.states import Phase, phase_of
from tests.conftest import CLUSTER_OPTIONS, LOCAL_CLUSTER_DIR, RUN_ID, TEST_OUTPUT, web_server_env
from tests.integration.helpers import log_text, submit_program, wait_for

pytestmark = pytest.mark.integration

SLURM_DIR = Path(f"/var/lib/training-console/test-slurmpool-{RUN_ID}")
USER = "ma-user"
WAIT_S = 120.0


def bring_up_slurm() -> localslurm.LocalSlurm:
    """Slurm on the local cluster's nodes, named as the console names them (idempotent: a second call restarts
    only what is not running)."""
    nodes = [localslurm.SlurmNode(entry.name, entry.address, entry.namespace, 4, 4096)
             for entry in localcluster.status(LOCAL_CLUSTER_DIR)]
    gateway = str(ipaddress.ip_network(CLUSTER_OPTIONS["subnet"]).network_address + 1)
    return localslurm.up(SLURM_DIR, nodes, controller_address=gateway, cluster=f"pool{RUN_ID}",
                         base_port=18000 + 10 * RUN_ID, users=[USER])


@pytest.fixture(scope="module")
def slurm_site(redis_url, celery_worker, local_cluster, tmp_path_factory):
    """A Slurm on the local cluster's two nodes, and Celery beat (the watch runs every second), for the module."""
    localslurm.down(SLURM_DIR)
    slurm = bring_up_slurm()
    beat_dir = tmp_path_factory.mktemp("beat")
    beat = services.start_celery_beat({**web_server_env(redis_url), "SLURM_WATCH_SECONDS": "1"},
                                      beat_dir / "beat.log")
    try:
        yield {"slurm": slurm, "nodes": local_cluster}
    finally:
        services.stop(beat)
        localslurm.down(SLURM_DIR)
        (TEST_OUTPUT / f"slurm-beat-{RUN_ID}.log").write_bytes((beat_dir / "beat.log").read_bytes())


def make_pool(console, slurm_site, *, root_ssh: bool) -> ResourcePool:
    slurm = slurm_site["slurm"]
    pool = ResourcePool(name="slurm", kind=ResourcePool.Kind.DEDICATED, backend=ResourcePool.Backend.SLURM,
                        slurm_url=slurm.rest_url, slurm_partition=slurm.partition, slurm_user=USER,
                        slurm_account="console", slurm_root_ssh=root_ssh,
                        # As an administrator gives it: the cluster's key, from which the console makes tokens.
                        sealed_slurm_jwt_key=seal_secret(base64.b64encode(localslurm.jwt_key(slurm.state_dir)).decode()))
    pool.full_clean()
    pool.save()
    for node, local in zip(console["nodes"], console["cluster"], strict=True):
        node.pool = pool
        if not root_ssh:
            # As a site registers them: the Slurm user and its key, which the nodes let in (root's is not used).
            login = localcluster.user_login(LOCAL_CLUSTER_DIR, local)
            node.ssh_user, node.private_key = login.ssh_user, login.private_key_path.read_text()
        node.save()
    return pool


def sshd_logs() -> dict[Path, int]:
    return {log: log.stat().st_size for log in sorted(LOCAL_CLUSTER_DIR.glob("nodes/*/sshd.log"))}


def logins_since(sizes: dict[Path, int]) -> list[str]:
    lines = []
    for log, size in sizes.items():
        with open(log, "rb") as handle:
            handle.seek(size)
            lines += [line for line in handle.read().decode(errors="replace").splitlines() if "Accepted publickey" in line]
    return lines


def cgroups_left(slurm_job_id: int, pattern: str = "") -> list[str]:
    """The Slurm job's cgroup folders on the nodes (cgroup v1: one a controller), or those below them that match
    `pattern`. Slurm removes them at the job's end unless something was left below them: a container's, made by the
    user's runc below the step's."""
    return sorted(str(folder) for folder in Path("/sys/fs/cgroup").glob(f"*/slurm_*/uid_*/job_{slurm_job_id}{pattern}"))


def assert_no_cgroups_left(job: TrainingJob) -> None:
    """A job the console ended leaves Slurm nothing in the way: its Slurm job's cgroups go. One Slurm ended from
    outside (a scancel, a time limit) had its step's tasks killed at once by srun, before anything could remove the
    containers' cgroups, and Slurm's own removal does not come again: the console's teardown removes the containers'
    and the tasks'; the step's and the job's, empty, are in root's folders, and stay (docs/slurm.md)."""
    slurm_ended = job.status == JobStatus.TERMINATED and job.stop_reason == StopReason.SLURM
    wait_until(f"Slurm job {job.slurm_job_id}'s cgroups go: {cgroups_left(job.slurm_job_id, '/**')}",
               lambda: not cgroups_left(job.slurm_job_id, "/*/*/" if slurm_ended else ""), timeout=60)


@pytest.fixture
def slurm_pool(console, slurm_site):
    """The Slurm pool without root; after the test, the nodes' sshd logs show the Slurm user's logins only, and the
    Slurm jobs of the jobs that ended left no cgroup behind."""
    pool = make_pool(console, slurm_site, root_ssh=False)
    # Counted from here: until the nodes carried the Slurm user's key they were the console's own, reached as root
    # (a health check Celery beat began then may log in a moment later).
    before = sshd_logs()
    yield pool
    logins = logins_since(before)
    assert not [line for line in logins if " for root " in line], f"a root login reached a node: {logins}"
    for job in TrainingJob.objects.filter(status__in=FINAL_STATES).exclude(slurm_job_id=None):
        assert_no_cgroups_left(job)


@pytest.fixture
def root_slurm_pool(console, slurm_site):
    return make_pool(console, slurm_site, root_ssh=True)


def rest_of(slurm_site) -> SlurmRest:
    slurm = slurm_site["slurm"]
    return SlurmRest(slurm.rest_url, Credentials(USER, localslurm.token(slurm.state_dir, USER, 600)))


def slurm_state(slurm_site, slurm_job_id: int) -> str:
    record = rest_of(slurm_site).job(slurm_job_id)
    return record["job_state"] if record else "VANISHED"


def wait_until(what: str, check, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.5)
    return found


def processes_of(job: TrainingJob) -> list[int]:
    """The job's processes (its containers' and theirs), found from this machine: the nodes share its processes,
    and logging in to look would be a root login on them."""
    marker = f"{job.dns_name}-worker-".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (proc / "environ").read_bytes() or marker in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def no_container_left(slurm_site, job: TrainingJob) -> None:
    assert processes_of(job) == [], f"something of {job.name} still runs"


def test_a_slurm_pools_check_says_which_slurm_answers(slurm_pool):
    assert check_pool(slurm_pool.pk) == "reachable: Slurm 22.05.8, REST API v0.0.38"
    slurm_pool.refresh_from_db()
    assert slurm_pool.slurm_status.startswith("reachable") and slurm_pool.slurm_checked_at is not None


def test_a_job_of_a_slurm_pool_runs_on_the_nodes_slurm_gave_and_slurm_accounts_it_completed(api, slurm_pool, slurm_site):
    job = submit_program(api, "numbered.py", pool="slurm", parameters=[{"name": "count", "value": "20"}])
    job = wait_for(job, [JobStatus.COMPLETED], timeout=WAIT_S * 2)
    assert job.slurm_job_id
    assert sorted(job.workers.values_list("node__pool__name", "node_name")) == [("slurm", "node-0"), ("slurm", "node-1")]
    assert job.log_lines.filter(text__startswith="SEQ ").count() == 2 * 2 * 20  # 2 nodes x 2 slots x 20
    # The console's end is Slurm's: the holder is told the job completed, and slurmdbd records it so.
    wait_until("Slurm records the job COMPLETED", lambda: slurm_state(slurm_site, job.slurm_job_id) == "COMPLETED")
    accounted = wait_until("the accounting is kept on the job",
                           lambda: TrainingJob.objects.get(pk=job.pk).slurm_accounting)
    assert (accounted["account"], accounted["state"], accounted["nodes"]) == ("console", "COMPLETED", 2)
    assert accounted["cpus"] == 4 and accounted["elapsed_seconds"] >= 0
    # The capacity page's view of the partition, as Slurm last said it.
    snapshot = wait_until("the accounts' use counts the job", lambda: next(
        (row for row in ResourcePool.objects.get(pk=slurm_pool.pk).slurm_accounts
         if row["account"] == "console" and row["jobs"] >= 1), None), timeout=WAIT_S)
    assert snapshot["shares"] >= 1
    assert sorted(node["name"] for node in ResourcePool.objects.get(pk=slurm_pool.pk).slurm_nodes) == ["node-0", "node-1"]
    assert not Node.objects.filter(pool=slurm_pool, allocated_to__isnull=False).exists()
    no_container_left(slurm_site, job)
    # Its pages, as its owner sees them: the job page with its Slurm facts, its log, the capacity page.
    browser = Client()
    browser.force_login(job.owner)
    page = browser.get(f"/jobs/{job.pk}").content.decode()
    assert f"{job.slurm_job_id} · COMPLETED" in page
    assert "account console, QOS" in page
    assert api.get(f"/api/v1/training-jobs/{job.pk}/log?offset=0").status_code == 200
    assert "Slurm partition batch" in browser.get("/capacity").content.decode()


def test_on_a_pool_without_root_a_users_folder_on_a_writable_shared_file_system_is_made_for_the_containers_uid(
        api, owner, slurm_pool, slurm_site):
    # As a site gives it: a folder of the console's own on the shared file system, the Slurm user's, 0755.
    root = Path(f"/mnt/tc-test-slurm-scratch-{RUN_ID}")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(mode=0o755)
    slurm_user = pwd.getpwnam(USER)
    os.chown(root, slurm_user.pw_uid, slurm_user.pw_gid)
    try:
        scratch = SharedPath.objects.create(name="scratch", path=str(root), writable=True)
        own = Path(scratch.user_folder(owner.pk, owner.username))
        job = submit_program(api, "data_roundtrip.py", pool="slurm", data_url=str(own), train_url=f"{own}/runs/first",
                             parameters=[{"name": "steps", "value": "2"}, {"name": "look", "value": str(root)}])
        job = wait_for(job, [JobStatus.COMPLETED], timeout=WAIT_S * 2)
        log = log_text(job)
        assert f"rank 0 sees [{own.name}] in {root}" in log, log
        assert sorted(path.name for path in (own / "runs" / "first" / "checkpoints").iterdir()) == ["step-0.txt", "step-1.txt"]
        # Not the host's uid 1000: the one the Slurm user's namespace maps the containers' 1000 to.
        made = own.stat()
        assert made.st_uid not in (0, 1000, slurm_user.pw_uid) and stat.S_IMODE(made.st_mode) == 0o700, made
        assert job.outputs_summary["state"] == "on_shared", job.outputs_summary
    finally:
        subprocess.run(["podman", "unshare", "rm", "-rf", str(root)], user=USER, cwd="/", check=False)
        shutil.rmtree(root, ignore_errors=True)


def test_a_pool_given_root_ssh_by_its_administrator_runs_its_containers_as_root_and_completes(
        api, root_slurm_pool, slurm_site):
    job = submit_program(api, "numbered.py", pool="slurm", parameters=[{"name": "count", "value": "5"}])
    job = wait_for(job, [JobStatus.COMPLETED], timeout=WAIT_S * 2)
    assert job.log_lines.filter(text__startswith="SEQ ").count() == 2 * 2 * 5
    wait_until("Slurm records the job COMPLETED", lambda: slurm_state(slurm_site, job.slurm_job_id) == "COMPLETED")
    no_container_left(slurm_site, job)


@pytest.mark.parametrize(("engine", "recipe", "code_dir", "image_fixture"), [
    ("Horovod", HOROVOD, "horovod-train", "horovod_image"), ("MindSpore-GPU", MINDSPORE, "mindspore-train", "mindspore_image")])
def test_an_engines_example_trains_on_the_two_nodes_slurm_gave(
        api, slurm_pool, slurm_site, request, engine, recipe, code_dir, image_fixture):
    image = request.getfixturevalue(image_fixture)
    version = EngineVersion.objects.create(engine=Engine.objects.create(name=engine), version=recipe.version,
                                           image=image, python=recipe.python)
    register_examples()
    body = {"name": code_dir, "engine": version.version, "spec": "local-cpu", "node_count": 2, "pool": "slurm",
            "code_dir": code_dir, "boot_file": "train.py", "parameters": [{"name": "steps", "value": "3"}]}
    response = api.post("/api/v1/training-jobs", body, format="json")
    assert response.status_code == 201, response.content
    job = wait_for(TrainingJob.objects.get(pk=response.json()["id"]), [JobStatus.COMPLETED], timeout=WAIT_S * 4)
    assert job.slurm_job_id and sorted(job.workers.values_list("node_name", flat=True)) == ["node-0", "node-1"]
    checksums = {line.rank: line.text.rsplit(" ", 1)[1]
                 for line in job.log_lines.filter(rank__isnull=False, text__contains="final weights checksum")}
    assert sorted(checksums) == [0, 1, 2, 3], f"each of the 4 ranks prints its checksum: {checksums}"
    assert len(set(checksums.values())) == 1, f"the ranks trained one model: {checksums}"
    wait_until("Slurm records the job COMPLETED", lambda: slurm_state(slurm_site, job.slurm_job_id) == "COMPLETED")
    browser = Client()
    browser.force_login(job.owner)
    assert browser.get(f"/jobs/{job.pk}").status_code == 200


def running_long_job(api) -> TrainingJob:
    """A job of the Slurm pool that prints for hours, once its ranks print."""
    job = submit_program(api, "numbered.py", pool="slurm",
                         parameters=[{"name": "count", "value": "100000"}, {"name": "per_second", "value": "10"}])
    job = wait_for(job, [JobStatus.RUNNING], timeout=WAIT_S * 2)
    wait_until("a rank line", lambda: job.log_lines.filter(text__startswith="SEQ ").exists())
    return job


def test_a_scancel_from_outside_ends_a_running_job_terminated_saying_slurm_cancelled_it(api, slurm_pool, slurm_site):
    job = running_long_job(api)
    # Started by the Slurm job's step, the containers' processes live in its cgroups, which hold and account them.
    cgroups = [Path(f"/proc/{pid}/cgroup").read_text() for pid in processes_of(job)]
    assert cgroups and all(f"/job_{job.slurm_job_id}/step_0/" in text for text in cgroups), cgroups
    subprocess.run(["scancel", str(job.slurm_job_id)], env=localslurm.tool_env(slurm_site["slurm"].conf), check=True)
    job = wait_for(job, [JobStatus.TERMINATED], timeout=WAIT_S)
    assert job.stop_reason == StopReason.SLURM
    assert f"Slurm cancelled job {job.slurm_job_id}" in job.status_message
    assert not Node.objects.filter(pool=slurm_pool, allocated_to__isnull=False).exists()
    no_container_left(slurm_site, job)


def test_a_job_near_its_slurm_time_limit_gets_its_notice_and_ends_as_an_auto_stop_before_slurm_kills_it(
        api, slurm_pool, slurm_site):
    job = submit_program(api, "ignores_notice.py", pool="slurm", auto_stop_hours=1, checkpoint_grace_seconds=6)
    job = wait_for(job, [JobStatus.RUNNING], timeout=WAIT_S * 2)
    wait_until("a rank line", lambda: job.log_lines.filter(text__startswith="tick ").exists())
    # The hour runs out within two minutes: an administrator shortens the limit, as its end would come anyway.
    record = rest_of(slurm_site).job(job.slurm_job_id)
    assert record is not None and record["time_limit"] == 60
    minutes = int((time.time() - record["start_time"]) // 60) + 2
    subprocess.run(["scontrol", "update", f"JobId={job.slurm_job_id}", f"TimeLimit={minutes}"],
                   env=localslurm.tool_env(slurm_site["slurm"].conf), check=True)

    job = wait_for(job, [JobStatus.TERMINATED], timeout=WAIT_S)

    assert job.stop_reason == StopReason.AUTO_STOP
    assert job.status_message == f"Stopped by auto stop: Slurm's time limit for job {job.slurm_job_id} is near"
    assert job.events.filter(kind="notice", message__startswith="Notice: SIGUSR1 sent to").exists()
    assert "got SIGUSR1 and carries on" in log_text(job), "the ranks had their notice before the end"
    # The console ended it before the limit: Slurm's accounting says the console's stop (a cancel), not TIMEOUT.
    wait_until("Slurm ends the job as the console's stop",
               lambda: phase_of(slurm_state(slurm_site, job.slurm_job_id)) is Phase.CANCELLED)
    assert time.time() < record["start_time"] + minutes * 60
    assert not Node.objects.filter(pool=slurm_pool, allocated_to__isnull=False).exists()
    no_container_left(slurm_site, job)


def test_a_user_stop_cancels_the_slurm_job(api, slurm_pool, slurm_site):
    job = running_long_job(api)
    assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code in (200, 202)
    job = wait_for(job, [JobStatus.TERMINATED], timeout=WAIT_S)
    wait_until("Slurm cancels the job", lambda: phase_of(slurm_state(slurm_site, job.slurm_job_id)) is Phase.CANCELLED)
    no_container_left(slurm_site, job)


def test_a_job_over_its_accounts_cpu_quota_waits_with_slurms_reason_then_runs(api, owner, slurm_pool, slurm_site):
    state_dir = slurm_site["slurm"].state_dir
    localslurm.sacctmgr(state_dir, "add", "account", "small", "GrpTRES=cpu=2")
    localslurm.sacctmgr(state_dir, "add", "user", USER, "Account=small")
    localslurm.sacctmgr(state_dir, "modify", "account", "small", "set", "GrpTRES=cpu=2")
    ResourcePool.objects.filter(pk=slurm_pool.pk).update(slurm_account="small")
    job = submit_program(api, "numbered.py", pool="slurm", parameters=[{"name": "count", "value": "5"}])
    wait_until("Slurm's reason on the job", lambda: "AssocGrpCpuLimit" in TrainingJob.objects.get(pk=job.pk).slurm_reason)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert waiting_reason(job) == (f"Slurm job {job.slurm_job_id}: your account's quota is in use: Cpu "
                                   "(AssocGrpCpuLimit)")
    browser = Client()
    browser.force_login(owner)
    assert "AssocGrpCpuLimit" in browser.get(f"/jobs/{job.pk}").content.decode()
    localslurm.sacctmgr(state_dir, "modify", "account", "small", "set", "GrpTRES=cpu=-1")
    wait_for(job, [JobStatus.COMPLETED], timeout=WAIT_S * 2)


def test_slurm_away_keeps_a_job_queued_saying_so_and_it_runs_when_slurm_is_back(api, slurm_pool, slurm_site):
    daemons = {daemon.name: daemon.pid for daemon in localslurm.status(slurm_site["slurm"].state_dir)}
    os.kill(daemons["slurmrestd"], 15)
    try:
        job = submit_program(api, "numbered.py", pool="slurm", parameters=[{"name": "count", "value": "5"}])
        wait_until("the job says Slurm cannot be reached",
                   lambda: "Slurm cannot be reached" in TrainingJob.objects.get(pk=job.pk).slurm_reason)
        job.refresh_from_db()
        assert job.status == JobStatus.PENDING and job.slurm_job_id is None
        slurm_pool.refresh_from_db()
        assert "did not answer" in slurm_pool.slurm_status
    finally:
        bring_up_slurm()
    wait_for(job, [JobStatus.COMPLETED], timeout=WAIT_S * 2)


def test_a_higher_priority_job_preempts_a_running_job_which_gets_its_notice_is_requeued_and_completes_as_its_next_attempt(
        api, slurm_pool, slurm_site):
    slurm = slurm_site["slurm"]
    # The preempted QOS gives a grace, as a site does for jobs that checkpoint: the console sees the preemption
    # begin, and the ranks get their notice within it.
    localslurm.sacctmgr(slurm.state_dir, "add", "qos", "low", "Priority=0", "GraceTime=40")
    localslurm.sacctmgr(slurm.state_dir, "add", "qos", "high", "Priority=1000", "Preempt=low", "PreemptMode=requeue")
    localslurm.sacctmgr(slurm.state_dir, "modify", "user", USER, "set", "qos=normal,low,high", "defaultqos=low")
    try:
        job = submit_program(api, "numbered.py", pool="slurm", checkpoint_grace_seconds=8,
                             parameters=[{"name": "count", "value": "300"}, {"name": "per_second", "value": "10"}])
        job = wait_for(job, [JobStatus.RUNNING], timeout=WAIT_S * 2)
        wait_until("a rank line", lambda: job.log_lines.filter(text__startswith="SEQ ").exists())
        # Someone else's urgent job wants both nodes whole.
        subprocess.run(["runuser", "-u", USER, "--", "sbatch", "--qos=high", "--nodes=2", "--exclusive",
                        f"--partition={slurm.partition}", "--account=console", "--output=/dev/null", "--wrap", "sleep 3"],
                       env=localslurm.tool_env(slurm.conf), check=True, cwd="/tmp", capture_output=True)
        wait_until("the job goes back to the queue", lambda: TrainingJob.objects.get(pk=job.pk).restart_count == 1)
        job = wait_for(job, [JobStatus.COMPLETED], timeout=WAIT_S * 3)
    finally:
        localslurm.sacctmgr(slurm.state_dir, "modify", "user", USER, "set", "defaultqos=normal")
    # Seen while Slurm's grace ran, not after it: the stop came with the notice, bounded by that grace.
    stop = job.events.get(kind="state:Terminating")
    assert stop.message.startswith(f"Slurm preempted job {job.slurm_job_id} for a higher-priority job: it takes the "
                                   "nodes back in "), stop.message
    notice = job.events.get(kind="notice")
    assert notice.message == "Notice: SIGUSR1 sent to 4 rank(s); up to 8 s to save a checkpoint", notice.message
    assert job.events.filter(kind="state:Pending", message__startswith="Requeued by Slurm (Slurm preempted").exists()
    # The auto restarts it may use are untouched: the preemption was not its failure.
    assert (job.restart_count, job.max_restarts) == (1, 1)
    second = job.log_lines.filter(seq__gt=job.attempt_log_starts[0], text__startswith="SEQ ")
    assert second.count() == 2 * 2 * 300
    no_container_left(slurm_site, job)
