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


def run_start_script(tmp_path, plan, worker, *, exists_for: int, signal: str,
                     env: dict[str, str] | None = None) -> tuple[int, list[str], float]:
    """The start script, run for real against a podman that records what it is asked (its container "exists" the
    first `exists_for` times asked; `podman run`'s words go to run-args), sent `signal` once it waits on the
    container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls, count = tmp_path / "calls", tmp_path / "count"
    (bin_dir / "podman").write_text(f"""#!/bin/sh
echo "$1" >> {calls}
[ "$1" = run ] && printf '%s\\n' "$@" > {tmp_path / "run-args"}
case "$1" in
wait) exec sleep 30 ;;
container) n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}; [ "$n" -lt {exists_for} ] ;;
*) exit 0 ;;
esac
""")
    (bin_dir / "podman").chmod(0o755)
    runnable = tmp_path / "start"
    runnable.write_text(start_script(plan, worker).replace(worker.workdir, str(tmp_path)))
    process = subprocess.Popen(["bash", str(runnable)], env={"PATH": f"{bin_dir}:/usr/bin:/bin", **(env or {})})
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

    job.checkpoint_grace_seconds = 5
    assert hold_seconds(planned_with(job)) == 15
    job.checkpoint_grace_seconds = 3600
    assert hold_seconds(planned_with(job)) == 20, "Slurm's KillWait (30 s by default) would kill the step first"


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


# /proc/PID/cgroup of a container the step started (cgroup v1, as measured on these nodes), and of one a node's
# Podman made under systemd's manager instead, outside the Slurm job.
IN_THE_STEP = """12:freezer:/slurm_node-1/uid_1001/job_1800007/step_0/0c7e4a
5:memory:/slurm_node-1/uid_1001/job_1800007/step_0/0c7e4a
4:cpu,cpuacct:/slurm_node-1/uid_1001/job_1800007/step_0/0c7e4a
0::/"""
OUTSIDE = """5:memory:/user.slice/user-1001.slice/user@1001.service/user.slice/libpod-0c7e4a.scope
0::/user.slice/user-1001.slice/user@1001.service/user.slice/libpod-0c7e4a.scope"""


def test_a_container_is_in_the_slurm_step_only_where_its_memory_cgroup_is_below_the_steps():
    from jobs.runtime.slurm_step import outside_the_step

    assert not outside_the_step(IN_THE_STEP)
    assert not outside_the_step("0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0")  # cgroup v2
    assert outside_the_step(OUTSIDE)
    assert outside_the_step(""), "nothing read: not known to be held by Slurm"


def test_the_console_waits_for_the_step_to_run_the_container_and_says_why_when_it_cannot(make_job, monkeypatch):
    _job, plan = planned(make_job, root_ssh=False)
    monkeypatch.setattr("jobs.runtime.slurm_step.POLL_SECONDS", 0)
    node = FakeNode(["absent", "created", "running\n" + IN_THE_STEP])
    asyncio.run(start_in_step(node, plan, plan.workers[0]))
    assert len(node.commands) == 4 and "start-gpu-0" in node.commands[0]
    failed = FakeNode(["absent", "failed\nError: image not known"])
    with pytest.raises(NodeError, match="starting the container in the Slurm job's step failed: Error: image not known"):
        asyncio.run(start_in_step(failed, plan, plan.workers[0]))
    outside = FakeNode(["running\n" + OUTSIDE])
    with pytest.raises(NodeError, match="it runs outside the Slurm job's cgroups"):
        asyncio.run(start_in_step(outside, plan, plan.workers[0]))
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


@pytest.mark.parametrize(("signal_name", "job_exit"), [("SIGUSR1", 0), ("SIGUSR2", 1)])
def test_the_batch_job_ends_only_once_its_steps_start_scripts_have_cleaned_up(tmp_path, signal_name, job_exit):
    """The job's end signals every process of the job; Slurm kills what is left of a step once its task or its job
    is over, so the batch script and the step's task wait for the start script's own removal of its container."""
    import contextlib
    import os
    import signal

    bin_dir, worker = tmp_path / "bin", tmp_path / "job" / "worker-0"
    bin_dir.mkdir()
    worker.mkdir(parents=True)
    # srun, as far as this script needs it: the one task, on this node, in the job's process group.
    (bin_dir / "srun").write_text('#!/bin/sh\nshift; exec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    started, cleaned = tmp_path / "started", tmp_path / "cleaned"
    # A start script whose removal of its container takes a while.
    (worker / "start-node-1").write_text(f"""rm -f -- "$0"
trap 'sleep 1.5; touch {cleaned}; exit 143' USR1 USR2
touch {started}
sleep 60 &
wait $!
""")
    script = tmp_path / "batch"
    script.write_text(STEP_SCRIPT)
    process = subprocess.Popen(["bash", str(script)], start_new_session=True, env={
        "PATH": f"{bin_dir}:/usr/bin:/bin", "TC_JOB_DIR": str(tmp_path / "job"), "SLURMD_NODENAME": "node-1"})
    try:
        for _ in range(200):
            if started.exists():
                break
            time.sleep(0.05)
        assert started.exists(), "the step's task ran its node's start script"
        os.killpg(process.pid, getattr(signal, signal_name))
        code = process.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # what is left of the group (the script's sleeps)
            os.killpg(process.pid, signal.SIGKILL)
    assert code == job_exit and cleaned.exists(), "the job ended before its container was cleaned up"


@pytest.mark.parametrize(("step_gpus", "given", "label"), [
    ("2,3", ["nvidia.com/gpu=2", "nvidia.com/gpu=3"], "2,3"),
    ("", ["nvidia.com/gpu=0", "nvidia.com/gpu=1"], "0,1"),
    ("gpu-a", [], "none"),
])
def test_a_container_gets_the_gpus_slurm_gave_its_step_and_the_plans_where_slurm_names_none_and_says_which(
        make_job, tmp_path, step_gpus, given, label):
    import dataclasses
    import signal

    _job, plan = planned(make_job, root_ssh=False)
    worker = dataclasses.replace(plan.workers[0], gpu_devices=("nvidia.com/gpu=0", "nvidia.com/gpu=1"))
    code, _calls, _took = run_start_script(tmp_path, plan, worker, exists_for=100, signal=signal.SIGUSR1,
                                           env={"SLURM_STEP_GPUS": step_gpus})
    words = (tmp_path / "run-args").read_text().splitlines()
    assert code == 143 and [words[i + 1] for i, word in enumerate(words) if word == "--device"] == given
    assert f"training-console.gpus={label}" in words, "the watch reads the GPUs it has from the container"
    assert words[-6:] == [plan.image, "/usr/sbin/sshd", "-D", "-e", "-f", words[-1]], "the devices come before the image"


def test_a_spec_without_gpus_gets_none_whatever_the_step_was_given(make_job, tmp_path):
    import signal

    _job, plan = planned(make_job, root_ssh=False)
    code, _calls, _took = run_start_script(tmp_path, plan, plan.workers[0], exists_for=100, signal=signal.SIGUSR1,
                                           env={"SLURM_STEP_GPUS": "0,1"})
    words = (tmp_path / "run-args").read_text().splitlines()
    assert code == 143 and "--device" not in words and "training-console.gpus=none" in words
