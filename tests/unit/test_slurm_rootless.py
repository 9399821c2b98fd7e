"""A Slurm pool without root: its nodes are reached as the Slurm user, the job's folders are that user's, what root
did on a node runs as the root of the user's own namespace, and the batch job's step starts the containers."""

import asyncio
import subprocess
import time
from types import SimpleNamespace

import pytest

from jobs.launch.plan import KeyPair, plan_job
from jobs.models import Node, ResourcePool, workers_launch_values
from jobs.runtime.containers import as_node_root, run_argv
from jobs.runtime.slurm_step import start_in_step, start_path, start_script
from jobs.runtime.ssh import NodeError
from jobs.slurm.batch import STEP_SCRIPT, PoolValues, batch_request

pytestmark = pytest.mark.django_db


def planned(make_job, *, root_ssh: bool):
    pool = ResourcePool.objects.create(name="site", backend=ResourcePool.Backend.SLURM, slurm_url="http://slurm:6820",
                                       slurm_partition="gpu", slurm_user="svc-ml", slurm_root_ssh=root_ssh)
    job = make_job(name="train", node_count=2)
    job.engine_version.image = "localhost/training-console/mpi:test"
    job.engine_version.save()
    workers = []
    for index in range(2):
        node = Node.objects.create(name=f"gpu-{index}", address=f"10.0.0.{index + 1}", spec=job.spec, pool=pool,
                                   ssh_user="root" if root_ssh else "svc-ml")
        workers.append(job.workers.create(index=index, node=node, node_name=node.name, address=node.address,
                                          hostname=f"{job.dns_name}-worker-{index}"))
    keys = KeyPair("private", "public")
    return job, plan_job(job.launch_values(), workers_launch_values(workers), work_root="/srv/jobs", user="ma-user",
                         preferred_uid=1000, client_key=keys, host_key=keys)


def test_a_worker_of_a_pool_without_root_works_in_the_slurm_users_folder_with_slurms_limits_not_podmans(make_job):
    job, plan = planned(make_job, root_ssh=False)
    worker = plan.workers[1]
    assert worker.rootless and worker.workdir == f"/var/tmp/training-console-svc-ml/{job.dns_name}/worker-1"
    assert worker.work_root == "/var/tmp/training-console-svc-ml"
    argv = run_argv(plan, worker)
    assert not {"--cpus", "--memory", "--memory-swap", "--pids-limit"} & set(argv), "Slurm's cgroups hold the limits"
    assert {"--shm-size", "--cap-drop", "--user"} <= set(argv) and "no-new-privileges" in argv
    # What --pids-limit gave: Slurm's cgroups count no processes, the job's uid's rlimit does.
    assert argv[argv.index("--ulimit") + 1] == f"nproc={plan.limits.pids}:{plan.limits.pids}"
    assert as_node_root(worker, ["sh", "x"]) == ["podman", "unshare", "sh", "x"]


def test_a_pool_given_root_ssh_runs_its_workers_as_the_consoles_own_nodes(make_job):
    job, plan = planned(make_job, root_ssh=True)
    worker = plan.workers[0]
    assert not worker.rootless and worker.workdir == f"/srv/jobs/{job.dns_name}/worker-0"
    assert "--memory" in run_argv(plan, worker) and as_node_root(worker, ["sh", "x"]) == ["sh", "x"]


def test_the_batch_job_of_a_pool_without_root_tells_its_step_where_the_jobs_folders_are(make_job):
    job, plan = planned(make_job, root_ssh=False)
    request = batch_request(job.launch_values(), PoolValues("gpu"), STEP_SCRIPT, name="tc-1",
                            job_folder=f"/var/tmp/training-console-svc-ml/{job.dns_name}")
    assert request["job"]["environment"]["TC_JOB_DIR"] == f"/var/tmp/training-console-svc-ml/{job.dns_name}"
    assert request["script"].count("srun ") == 1 and 'worker-*/"start-$SLURMD_NODENAME"' in request["script"]
    # The step's task finds its worker's start script by its node's Slurm name, the name the console gives it.
    assert start_path(plan.workers[1]) == f"{plan.workers[1].workdir}/start-gpu-1"


def run_start_script(tmp_path, plan, worker, *, exists_for: int, signal: str) -> tuple[int, list[str], float]:
    """The start script, run for real against a podman that records what it is asked (its container "exists" the
    first `exists_for` times asked), sent `signal` once it waits on the container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls, count = tmp_path / "calls", tmp_path / "count"
    (bin_dir / "podman").write_text(f"""#!/bin/sh
echo "$1" >> {calls}
case "$1" in
wait) exec sleep 30 ;;
container) n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}; [ "$n" -lt {exists_for} ] ;;
*) exit 0 ;;
esac
""")
    (bin_dir / "podman").chmod(0o755)
    runnable = tmp_path / "start"
    runnable.write_text(start_script(plan, worker).replace(worker.workdir, str(tmp_path)))
    process = subprocess.Popen(["bash", str(runnable)], env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    for _ in range(100):
        if calls.exists() and "wait" in calls.read_text():
            break
        time.sleep(0.05)
    sent = time.monotonic()
    process.send_signal(signal)
    code = process.wait(timeout=30)
    assert not runnable.exists(), "read once, then gone: the next attempt finds only its own"
    return code, calls.read_text().split(), time.monotonic() - sent


def test_slurms_sigterm_leaves_the_container_to_the_console_a_while_then_removes_it(make_job, tmp_path):
    import signal

    _job, plan = planned(make_job, root_ssh=False)
    worker = plan.workers[0]
    script = start_script(plan, worker)
    assert script.startswith('rm -f -- "$0"\n') and "podman run --detach" in script
    # A preemption's grace begins with SIGTERM to the step: the console ends the container after its ranks' notice
    # (here it is gone at the third look), and only then does the script go.
    code, calls, took = run_start_script(tmp_path, plan, worker, exists_for=2, signal=signal.SIGTERM)
    assert code == 143 and calls == ["run", "wait", "container", "container", "container", "rm"]
    assert took >= 1.0


def test_the_jobs_end_removes_what_the_console_left_at_once(make_job, tmp_path):
    import signal

    _job, plan = planned(make_job, root_ssh=False)
    code, calls, took = run_start_script(tmp_path, plan, plan.workers[0], exists_for=100, signal=signal.SIGUSR1)
    assert code == 143 and calls == ["run", "wait", "rm"] and took < 5


def test_a_container_the_console_never_ends_is_removed_within_slurms_kill_wait(make_job):
    job, _plan = planned(make_job, root_ssh=False)
    from jobs.runtime.slurm_step import hold_seconds

    job.checkpoint_grace_seconds = 8
    assert hold_seconds(planned_with(job)) == 18
    job.checkpoint_grace_seconds = 3600
    assert hold_seconds(planned_with(job)) == 25, "Slurm's KillWait (30 s by default) would kill the step first"


def planned_with(job):
    workers = workers_launch_values(list(job.workers.order_by("index")))
    keys = KeyPair("private", "public")
    return plan_job(job.launch_values(), workers, work_root="/srv/jobs", user="ma-user", preferred_uid=1000,
                    client_key=keys, host_key=keys)


class FakeNode:
    """The SSH boundary: answers the poll with the given states, one a look."""

    def __init__(self, states: list[str]):
        self.states = states
        self.commands: list[str] = []

    async def run(self, command, check=False, timeout=None, input=None):
        self.commands.append(command)
        stdout = "" if "mv " in command else self.states.pop(0)
        return SimpleNamespace(exit_status=0, stdout=stdout, stderr="")


def test_the_console_waits_for_the_step_to_run_the_container_and_says_why_when_it_cannot(make_job, monkeypatch):
    _job, plan = planned(make_job, root_ssh=False)
    monkeypatch.setattr("jobs.runtime.slurm_step.POLL_SECONDS", 0)
    node = FakeNode(["absent", "created", "running"])
    asyncio.run(start_in_step(node, plan, plan.workers[0]))
    assert len(node.commands) == 4 and "start-gpu-0" in node.commands[0]
    failed = FakeNode(["absent", "failed\nError: image not known"])
    with pytest.raises(NodeError, match="starting the container in the Slurm job's step failed: Error: image not known"):
        asyncio.run(start_in_step(failed, plan, plan.workers[0]))
    monkeypatch.setattr("jobs.runtime.slurm_step.START_SECONDS", 0)
    with pytest.raises(NodeError, match="the step did not start it within 0 s"):
        asyncio.run(start_in_step(FakeNode(["absent"] * 3), plan, plan.workers[0]))


@pytest.mark.parametrize("root_ssh", [False, True])
def test_a_pool_without_root_submits_its_step_and_one_with_root_ssh_the_holder(make_job, root_ssh):
    import json

    from jobs.backends.slurm import submit
    from jobs.slurm.batch import HOLDER_SCRIPT
    from tests.unit.test_slurm_client import client

    job, _plan = planned(make_job, root_ssh=root_ssh)
    job.pool = ResourcePool.objects.get(name="site")
    job.save()
    rest, fake = client({("POST", "/slurm/v0.0.38/job/submit"): (200, {"errors": [], "job_id": 42})})
    submit(rest, job, None)
    sent = json.loads(fake.requests[0].body)
    if root_ssh:
        assert sent["script"] == HOLDER_SCRIPT and "exclusive" not in sent["job"]
        assert "TC_JOB_DIR" not in sent["job"]["environment"]
    else:
        assert sent["script"] == STEP_SCRIPT and "exclusive" not in sent["job"]
        assert sent["job"]["environment"]["TC_JOB_DIR"] == f"/var/tmp/training-console-svc-ml/{job.dns_name}"
