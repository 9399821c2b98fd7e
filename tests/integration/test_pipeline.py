"""The whole pipeline on the local cluster: API -> Celery -> containers over SSH -> mpirun -> log -> result."""

import json
import time

import pytest

from jobs.code_dirs.service import register_examples
from jobs.models import JobStatus, Network, Node, ResourceSpec, TrainingJob
from tests.integration.helpers import (
    CLUSTER_SLOTS,
    code_dir_from_program,
    log_text,
    processes_of_job_on_node,
    rank_lines,
    wait_for,
)

TRICKY = "a b 'c' \"d\" $(id) ; x `id` \\ ção ✓"


def submit(api, **fields) -> TrainingJob:
    body = {"name": "probe", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 2, **fields}
    response = api.post("/api/v1/training-jobs", body, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


def probes(job: TrainingJob) -> list[dict]:
    return [json.loads(line.text.removeprefix("PROBE ")) for line in rank_lines(job) if line.text.startswith("PROBE ")]


def nodes_free() -> bool:
    return not Node.objects.filter(allocated_to__isnull=False).exists()


def test_the_example_trains_on_two_nodes_and_its_ranks_agree(api, console):
    register_examples()
    job = submit(api, name="gpu-train", code_dir="gpu-train", boot_file="train.py",
                 parameters=[{"name": "steps", "value": "5"}], data_url="/cache/data")
    job = wait_for(job, [JobStatus.COMPLETED], timeout=180)

    assert job.exit_code == 0
    lines = rank_lines(job)
    banners = [line for line in lines if " on host " in line.text]
    assert sorted(line.rank for line in banners) == [0, 1, 2, 3]
    assert {line.text.split(" on host ")[1].split()[0] for line in banners} == {
        f"{job.dns_name}-worker-0", f"{job.dns_name}-worker-1"}
    checksums = {line.text.rsplit(" ", 1)[1] for line in lines if "final weights checksum" in line.text}
    assert len(checksums) == 1, f"ranks disagree on the allreduced weights: {checksums}"
    assert sum("loss=" in line.text for line in lines) == 5
    assert job.command.startswith("mpirun -np 4 -hostfile /home/ma-user/.mpi/hostfile -mca plm_rsh_args ")
    assert job.command.endswith("/home/ma-user/user-job-dir/gpu-train/train.py --data_url=/cache/data --steps=5")
    assert job.hostfile == f"{job.dns_name}-worker-0 slots=2\n{job.dns_name}-worker-1 slots=2\n"
    assert "-x MA_NUM_HOSTS\n" in job.tune_file and "-x VC_WORKER_HOSTS\n" in job.tune_file
    assert [worker.state for worker in job.workers.all()] == ["Stopped", "Stopped"]
    assert nodes_free()


def test_a_tricky_parameter_and_variable_reach_every_rank_byte_for_byte(api, console, programs_dir):
    code_dir_from_program("probe-tricky", "probe.py")
    job = submit(api, code_dir="probe-tricky", boot_file="probe.py",
                 parameters=[{"name": "tricky", "value": TRICKY}, {"name": "show_env", "value": "TRICKY,MA_NUM_HOSTS,VC_TASK_INDEX"}],
                 env={"TRICKY": TRICKY})
    job = wait_for(job, [JobStatus.COMPLETED])

    reports = probes(job)
    assert len(reports) == 2 * CLUSTER_SLOTS
    assert {report["host"] for report in reports} == {f"{job.dns_name}-worker-0", f"{job.dns_name}-worker-1"}
    for report in reports:
        assert f"--tricky={TRICKY}" in report["argv"]
        assert report["env"]["TRICKY"] == TRICKY
        assert report["env"]["MA_NUM_HOSTS"] == "2"
        assert report["cwd"] == "/home/ma-user/user-job-dir/probe-tricky"
        assert report["user"] != 0, "job processes must not run as root"
        assert report["cache_writable"], "/cache is the job's own local disk"
        assert report["allreduce"] == sum(range(1, 2 * CLUSTER_SLOTS + 1))
    # Each worker keeps its own index: the tune file does not carry VC_TASK_INDEX.
    by_host = {report["host"]: report["env"]["VC_TASK_INDEX"] for report in reports}
    assert by_host == {f"{job.dns_name}-worker-0": "0", f"{job.dns_name}-worker-1": "1"}


def test_a_rank_that_exits_with_3_fails_the_job_with_3_and_frees_its_nodes(api, console):
    code_dir_from_program("probe-exit", "probe.py")
    job = submit(api, code_dir="probe-exit", boot_file="probe.py",
                 parameters=[{"name": "exit_rank", "value": "1"}, {"name": "exit_code", "value": "3"}])
    job = wait_for(job, [JobStatus.FAILED])

    assert job.exit_code == 3
    assert "return code: 3" in job.status_message
    assert nodes_free()


def test_a_job_waits_pending_while_nodes_are_busy_and_runs_when_they_free_up(api, console):
    code_dir_from_program("probe-queue", "probe.py")
    first = submit(api, name="first", code_dir="probe-queue", boot_file="probe.py", parameters=[{"name": "sleep", "value": "5"}])
    second = submit(api, name="second", code_dir="probe-queue", boot_file="probe.py")
    wait_for(first, [JobStatus.RUNNING])
    second.refresh_from_db()
    assert second.status == JobStatus.PENDING
    detail = api.get(f"/api/v1/training-jobs/{second.pk}").json()
    assert "0 free" in detail["waiting_reason"]

    wait_for(first, [JobStatus.COMPLETED])
    wait_for(second, [JobStatus.COMPLETED])
    first.refresh_from_db()
    second.refresh_from_db()
    assert second.started_at >= first.ended_at
    assert nodes_free()


def test_a_job_larger_than_the_cluster_is_refused_at_submission(api, console):
    code_dir_from_program("probe-big", "probe.py")
    body = {"name": "too-big", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 3,
            "code_dir": "probe-big", "boot_file": "probe.py"}
    response = api.post("/api/v1/training-jobs", body, format="json")
    assert response.status_code == 400
    assert "has 2 node(s) of this spec" in response.json()["node_count"][0]
    assert not TrainingJob.objects.filter(name="too-big").exists()


def test_a_small_job_without_a_limit_waits_behind_a_big_one_while_nodes_are_busy(api, console):
    code_dir_from_program("probe-fifo", "probe.py")
    busy = submit(api, name="busy", code_dir="probe-fifo", boot_file="probe.py", node_count=1,
                  parameters=[{"name": "sleep", "value": "8"}])
    wait_for(busy, [JobStatus.RUNNING])
    big = submit(api, name="big", code_dir="probe-fifo", boot_file="probe.py", node_count=2)
    small = submit(api, name="small", code_dir="probe-fifo", boot_file="probe.py", node_count=1)
    # Both submissions have been dispatched by now (each queues a dispatch on commit); give the worker time.
    time.sleep(3)
    big.refresh_from_db()
    small.refresh_from_db()
    assert (big.status, small.status) == (JobStatus.PENDING, JobStatus.PENDING), "the small job jumped the queue"
    assert "needs 2" in api.get(f"/api/v1/training-jobs/{big.pk}").json()["waiting_reason"]

    # First in, first out: once the busy job ends, the big one runs, then the small one.
    wait_for(big, [JobStatus.COMPLETED], timeout=60)
    wait_for(small, [JobStatus.COMPLETED], timeout=60)
    big.refresh_from_db()
    small.refresh_from_db()
    assert small.started_at >= big.started_at
    assert nodes_free()


@pytest.mark.fault("a node's sshd down before the start", "the job fails naming the node; the other node is freed")
def test_a_node_that_does_not_answer_ssh_fails_the_job_naming_it_and_frees_the_other(api, console):
    good, = console["nodes"][:1]
    flaky = ResourceSpec.objects.create(name="flaky", cpu_cores=2, memory_gb=4, cpu_slots_per_node=2, network=Network.SOCKET)
    Node.objects.filter(pk=good.pk).update(spec=flaky)
    dead = Node(name="dead-node", address=good.address, ssh_port=2, ssh_user="root", spec=flaky)
    dead.private_key = good.private_key
    dead.save()
    code_dir_from_program("probe-dead", "probe.py")

    job = submit(api, code_dir="probe-dead", boot_file="probe.py", spec="flaky")
    job = wait_for(job, [JobStatus.FAILED])

    assert "dead-node" in job.status_message
    assert "refused" in job.status_message
    assert "dead-node" in log_text(job)
    assert nodes_free()


def test_stopping_a_running_job_ends_every_rank_on_every_node(api, console):
    code_dir_from_program("probe-stop", "probe.py")
    job = submit(api, code_dir="probe-stop", boot_file="probe.py", parameters=[{"name": "sleep", "value": "600"}])
    wait_for(job, [JobStatus.RUNNING])
    for _ in range(100):
        if len(probes(job)) == 2 * CLUSTER_SLOTS:
            break
        time.sleep(0.2)
    assert len(probes(job)) == 2 * CLUSTER_SLOTS
    assert all(processes_of_job_on_node(node, job) for node in console["cluster"])

    response = api.post(f"/api/v1/training-jobs/{job.pk}/stop")
    assert response.status_code == 200
    job = wait_for(job, [JobStatus.TERMINATED], timeout=60)

    for node in console["cluster"]:
        assert processes_of_job_on_node(node, job) == [], f"processes of the job left on {node.name}"
    assert nodes_free()
