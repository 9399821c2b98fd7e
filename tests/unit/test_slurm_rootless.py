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


def test_the_start_script_starts_the_container_waits_on_it_and_removes_it_when_slurm_ends_the_step(make_job, tmp_path):
    _job, plan = planned(make_job, root_ssh=False)
    worker = plan.workers[0]
    script = start_script(plan, worker)
    assert script.startswith('rm -f -- "$0"\n')
    assert f"trap 'podman rm --force --ignore --time 2 {worker.container_name} >/dev/null 2>&1; exit 143' TERM" in script
    assert "podman run --detach" in script and f"podman wait {worker.container_name}" in script
    # Run for real with a podman that records what it is asked: a SIGTERM (Slurm's end of the step) removes it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "podman").write_text(f'#!/bin/sh\necho "$1" >> {calls}\n[ "$1" = wait ] && exec sleep 30\nexit 0\n')
    (bin_dir / "podman").chmod(0o755)
    runnable = tmp_path / "start"
    runnable.write_text(script.replace(worker.workdir, str(tmp_path)))
    process = subprocess.Popen(["bash", str(runnable)], env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    for _ in range(100):
        if calls.exists() and "wait" in calls.read_text():
            break
        time.sleep(0.05)
    process.terminate()
    assert process.wait(timeout=10) == 143
    assert calls.read_text().split() == ["run", "wait", "rm"]
    assert not runnable.exists(), "read once, then gone: the next attempt finds only its own"


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
