"""Workers are Podman containers from the engine's image, on the local cluster: the image's python, the
job's processes alone in their container, nothing of the host in reach, the spec's memory enforced, and
nothing of the job left on any node afterwards."""

import os
import shutil
import stat
from pathlib import Path

from django.conf import settings

from jobs.images.recipes import MPI
from jobs.models import JobStatus, Node, ResourceSpec, TrainingJob
from tests.integration.helpers import code_dir_from_program, on_node, reports, wait_for

RANKS = 4  # 2 nodes x 2 slots
# What runs in a worker's container: its sshd (and the sessions it forks), orted, mpirun on worker-0,
# the rank agents, their filters and the ranks; nothing of the node's or another job's.
JOB_PROCESSES = ("sshd", "/usr/sbin/sshd", "orted", "/usr/bin/orted", "mpirun", "/usr/bin/mpirun", "sh ",
                 "/bin/sh ", "python", "/usr/local/bin/python", "/usr/bin/python", "bash ", "/bin/bash ",
                 # what a rank of the job runs from its code directory (here: the planted setuid program)
                 "/home/ma-user/user-job-dir/",
                 # the launch's sealed programs (mpirun, orted, ssh, the rank agents' filters: seal-tools.sh)
                 "/opt/training-console/bin/", "sed ")


def submit(api, **fields) -> TrainingJob:
    body = {"name": "isolation", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 2,
            "code_dir": "isolation", "boot_file": "isolation.py", **fields}
    response = api.post("/api/v1/training-jobs", body, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


def isolation_code_dir() -> None:
    code_dir = code_dir_from_program("isolation", "isolation.py")
    # A setuid-root program in the uploaded code: in the container it must run with the job's rights only.
    planted = Path(code_dir.path) / "id-setuid"
    shutil.copy("/usr/bin/id", planted)
    os.chown(planted, 0, 0)
    planted.chmod(0o4755)
    assert planted.stat().st_mode & stat.S_ISUID


def test_ranks_run_in_containers_of_the_engine_image_and_see_nothing_of_the_host(api, console):
    isolation_code_dir()
    database = str(settings.DATABASES["default"]["NAME"])
    secret_key = str(Path(settings.VAR_DIR) / "secret_key")
    # A file any account of the host may read: only a container that sees nothing of the host misses it.
    marker = Path(settings.NODE_WORK_ROOT).parent / f"host-marker-{os.getpid()}.txt"
    marker.write_text("the host's own file\n")
    marker.chmod(0o644)
    job = submit(api, parameters=[{"name": "try_read", "value": f"{database},{secret_key},{marker}"}])
    try:
        wait_for(job, [JobStatus.COMPLETED])
    finally:
        marker.unlink()
    found = reports(job, "ISOLATION")
    assert [report["rank"] for report in found] == list(range(RANKS))
    assert {report["host"] for report in found} == {f"{job.dns_name}-worker-0", f"{job.dns_name}-worker-1"}
    assert {report["python"] for report in found} == {"/usr/local/bin/python"}, "the image's python, not the node's"
    assert {report["allreduce"] for report in found} == {sum(range(1, RANKS + 1))}
    assert {report["uid"] for report in found} == {1000}
    assert {report["setuid_uid"] for report in found} == {"1000"}, "a setuid binary gains nothing"
    for report in found:
        assert report["reads"] == {database: False, secret_key: False, str(marker): False}, report
        # Only the job's own processes: the worker's sshd, orted, the rank agents and ranks, the probe's ls.
        assert not [line for line in report["processes"] if "celery" in line or "uvicorn" in line or "pytest" in line]
        foreign = [line for line in report["processes"] if line and not line.startswith(JOB_PROCESSES)]
        assert foreign == [], f"rank {report['rank']} sees processes that are not its job's: {foreign}"
        assert any(line.startswith(("sshd", "/usr/sbin/sshd")) for line in report["processes"])
    job.refresh_from_db()
    assert MPI.reference == job.engine_version.image


def test_a_job_cannot_collect_the_consoles_files_as_its_outputs(api, console):
    isolation_code_dir()
    job = submit(api, train_url=str(settings.VAR_DIR))

    wait_for(job, [JobStatus.COMPLETED])
    job.refresh_from_db()
    assert job.outputs_summary["state"] == "missing", job.outputs_summary
    assert job.output_files.count() == 0


def test_a_rank_past_the_specs_memory_is_killed_and_the_card_says_out_of_memory(api, console):
    isolation_code_dir()
    small = ResourceSpec.objects.create(name="local-1g", cpu_cores=2, memory_gb=1, cpu_slots_per_node=2)
    Node.objects.update(spec=small)
    job = submit(api, spec="local-1g", parameters=[{"name": "allocate_mb", "value": "1600"}])

    wait_for(job, [JobStatus.FAILED])
    job.refresh_from_db()
    assert job.exit_code == 137 or job.failure["signal"] == 9, job.failure
    assert job.failure["kind"] == "oom" and job.failure["rank"] == 0, job.failure


def test_teardown_leaves_no_container_process_or_mount_of_the_job_on_any_node(api, console):
    isolation_code_dir()
    job = submit(api)
    wait_for(job, [JobStatus.COMPLETED])
    names = list(job.workers.values_list("container_name", flat=True))
    assert all(name.startswith(f"tc-{job.pk}-w") for name in names)
    for node in console["cluster"]:
        containers = on_node(node, f"podman ps --all --quiet --filter label=training-console.job={job.pk}")
        assert containers.strip() == "", f"{node.name} still has a container of the job"
        mounts = on_node(node, f"grep -c {job.dns_name} /proc/self/mountinfo || true")
        assert mounts.strip() == "0", f"{node.name} still has a mount of the job"
    # Not even an empty folder with the job's name is left.
    assert not Path(settings.NODE_WORK_ROOT, job.dns_name).exists()


def test_a_node_without_the_image_gets_it_from_the_console_and_the_job_runs(api, console):
    isolation_code_dir()
    for node in console["cluster"]:
        on_node(node, f"podman rmi --force {MPI.reference} >/dev/null 2>&1 || true")
        assert on_node(node, f"podman image exists {MPI.reference} && echo yes || echo no").strip() == "no"
    job = submit(api)

    wait_for(job, [JobStatus.COMPLETED])
    service = "\n".join(job.log_lines.filter(stream="system").values_list("text", flat=True))
    assert "pulling the layers it lacks from the console's registry" in service
    for node in console["cluster"]:
        assert on_node(node, f"podman image exists {MPI.reference} && echo yes || echo no").strip() == "yes"


def test_each_workers_cpu_and_memory_are_sampled_from_its_container_while_the_job_runs(api, console, owner):
    code_dir_from_program("busy", "numbered.py")
    job = submit(api, name="sampled", code_dir="busy", boot_file="numbered.py",
                 parameters=[{"name": "count", "value": "3000"}, {"name": "per_second", "value": "250"}])
    job = wait_for(job, [JobStatus.COMPLETED], timeout=180)

    samples = list(job.resource_samples.order_by("at"))
    assert {sample.worker_index for sample in samples} == {0, 1}
    assert all(sample.memory_bytes > 1024 * 1024 for sample in samples), "a container with Python in it uses memory"
    limit = console["spec"].memory_gb * 1024**3
    assert {sample.memory_limit_bytes for sample in samples} == {limit}, "the spec's limit, as the cgroup has it"
    cpu = [sample.cpu_percent for sample in samples]
    assert any(share > 0 for share in cpu) and all(0 <= share < 400 for share in cpu), cpu

    answer = api.get(f"/api/v1/training-jobs/{job.pk}/resources").json()
    assert answer["final"] is True
    assert [(worker["worker"], len(worker["samples"])) for worker in answer["workers"]] == [
        (index, sum(sample.worker_index == index for sample in samples)) for index in (0, 1)]
