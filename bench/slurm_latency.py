"""A 2-node job through a Slurm pool (without root, and with the root SSH option) beside the same job on the
console's own pool, on the same two nodes, in one run: submission -> first line of a rank's output -> Completed,
and for the Slurm pools where the extra time goes (submission -> Slurm runs it -> the console sees it and has
the nodes).

Brings up everything it measures on its own bridge (database, Redis, a Celery worker and beat, a local
cluster of 2 nodes, a Slurm on those nodes), alternates the two pools run by run (the nodes move between
them: the same records, named as Slurm names them), prints the numbers, and takes it all down.

    .venv/bin/python bench/slurm_latency.py [--runs 5]
"""

import argparse
import base64
import ipaddress
import os
import statistics
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
BENCH_VAR = BASE_DIR / "var" / "bench-slurm-latency"
SUBNET = "10.84.0.0/24"
sys.path.insert(0, str(BASE_DIR))
os.environ.update(
    DJANGO_SETTINGS_MODULE="console.settings",
    CONSOLE_VAR_DIR=str(BENCH_VAR),
    NODE_WORK_ROOT="/var/lib/training-console/bench-slurm-jobs",
    LOCALCLUSTER_SUBNET=SUBNET,
    LOCALCLUSTER_BRIDGE="tcslbenchbr",
    LOCALCLUSTER_PREFIX="tcslbench",
    LOCALCLUSTER_STATE_DIR="/var/lib/training-console/bench-slurm-cluster",
    SLURM_WATCH_SECONDS="1",
)
SLURM_DIR = Path("/var/lib/training-console/bench-slurm")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from console import services

    redis_port = services.free_port()
    os.environ["REDIS_URL"] = os.environ["CELERY_BROKER_URL"] = f"redis://127.0.0.1:{redis_port}/0"
    BENCH_VAR.mkdir(parents=True, exist_ok=True)
    (BENCH_VAR / "console.sqlite3").unlink(missing_ok=True)

    import django

    from console.state import prepare

    prepare()
    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from jobs import localcluster, localslurm
    from jobs.models import JobStatus, LogLine, Node, ResourcePool, ResourceSpec, TrainingJob
    from jobs.secret_box import seal_secret
    from jobs.submission.forms import TrainingJobForm
    from jobs.submission.jobs import submit_job

    redis = services.start_redis(redis_port, BENCH_VAR / "redis.log")
    worker = beat = None
    try:
        call_command("migrate", verbosity=0)
        call_command("seedconsole", password="bench", stdout=open(os.devnull, "w"))
        call_command("localcluster", "up", nodes=2, slots=2, stdout=open(os.devnull, "w"))
        state = Path(os.environ["LOCALCLUSTER_STATE_DIR"])
        gateway = str(ipaddress.ip_network(SUBNET).network_address + 1)
        slurm = localslurm.up(SLURM_DIR, [localslurm.SlurmNode(entry.name, entry.address, entry.namespace, 4, 8192)
                                          for entry in localcluster.status(state)],
                              controller_address=gateway, cluster="bench", base_port=19000, users=["ma-user"])
        own = ResourcePool.objects.create(name="own", kind=ResourcePool.Kind.DEDICATED)
        key = base64.b64encode(localslurm.jwt_key(SLURM_DIR)).decode()
        pools = [own] + [ResourcePool.objects.create(
            name=name, kind=ResourcePool.Kind.DEDICATED, backend=ResourcePool.Backend.SLURM,
            slurm_url=slurm.rest_url, slurm_partition=slurm.partition, slurm_user="ma-user", slurm_account="console",
            slurm_root_ssh=root_ssh, sealed_slurm_jwt_key=seal_secret(key))
            for name, root_ssh in (("slurm", False), ("slurm-root", True))]
        # How each pool reaches the nodes: as root, or (the Slurm pool without root) as the Slurm user.
        logins = {node.name: (node.ssh_user, node.private_key) for node in Node.objects.all()}
        user_logins = {local.name: local for local in (
            localcluster.user_login(state, localcluster.LocalNode(entry.name, entry.address, 22, "root", state, ""))
            for entry in localcluster.status(state))}
        worker = services.start_celery_worker({}, BENCH_VAR / "celery-worker.log")
        beat = services.start_celery_beat({}, BENCH_VAR / "celery-beat.log")
        time.sleep(3)
        owner = get_user_model().objects.get(username="admin")
        spec = ResourceSpec.objects.get(name="local-cpu-2")
        results: dict[str, dict[str, list[float]]] = {pool.name: {} for pool in pools}
        # One run of each pool first, not counted: a node's first job loads the image into the store that pool's
        # way to the node uses (root's, or the Slurm user's own without root).
        for run in range((args.runs + 1) * len(pools)):
            pool = pools[run % len(pools)]
            for node in Node.objects.all():  # the same two nodes, in one pool or another
                node.pool = pool
                if pool.is_slurm and not pool.slurm_root_ssh:
                    login = user_logins[node.name]
                    node.ssh_user, node.private_key = login.ssh_user, login.private_key_path.read_text()
                else:
                    node.ssh_user, node.private_key = logins[node.name]
                node.save()
            form = TrainingJobForm(data={"name": f"latency-{run}", "engine": "MPI", "code_dir": "gpu-train",
                                         "boot_file": "train.py", "spec": spec.pk, "node_count": 2, "pool": pool.pk,
                                         "parameters": [{"name": "steps", "value": "5"}]})
            assert form.is_valid(), form.errors
            submitted = time.monotonic()
            job = submit_job(form, owner)
            marks: dict[str, float] = {}
            while True:
                row = TrainingJob.objects.values("status", "slurm_state").get(pk=job.pk)
                if "slurm_running" not in marks and row["slurm_state"] == "RUNNING":
                    marks["slurm_running"] = time.monotonic() - submitted
                if "creating" not in marks and row["status"] != JobStatus.PENDING:
                    marks["creating"] = time.monotonic() - submitted
                if "first_line" not in marks and LogLine.objects.filter(job=job, rank__isnull=False).exists():
                    marks["first_line"] = time.monotonic() - submitted
                if row["status"] in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.ABNORMAL, JobStatus.TERMINATED):
                    break
                time.sleep(0.02)
            assert row["status"] == JobStatus.COMPLETED, f"run {run} ({pool.name}) ended {row['status']}"
            marks["completed"] = time.monotonic() - submitted
            # The next run may need the nodes back: the Slurm job is given back within a watch.
            while Node.objects.filter(allocated_to__isnull=False).exists() or (
                    pool.is_slurm and not TrainingJob.objects.get(pk=job.pk).slurm_released):
                time.sleep(0.05)
            for name, value in marks.items():
                if run >= len(pools):
                    results[pool.name].setdefault(name, []).append(value)
            print(f"run {run} {pool.name}{' (warm-up)' if run < len(pools) else ''}: " + ", ".join(f"{name} {value:.2f} s" for name, value in marks.items()),
                  flush=True)

        def median(pool: str, mark: str) -> str:
            values = results[pool].get(mark)
            return f"{statistics.median(values):.2f} s" if values else "-"

        print(f"2-node job, {args.runs} runs each, medians: console's own pool: first rank line {median('own', 'first_line')}, "
              f"Completed {median('own', 'completed')}" + "".join(
                  f"; {name} ({words}): Slurm runs it {median(name, 'slurm_running')}, nodes given "
                  f"{median(name, 'creating')}, first rank line {median(name, 'first_line')}, Completed "
                  f"{median(name, 'completed')}"
                  for name, words in (("slurm", "Slurm pool without root"), ("slurm-root", "Slurm pool, root SSH"))))
    finally:
        services.stop(beat)
        services.stop(worker)
        localslurm.down(SLURM_DIR)
        call_command("localcluster", "down", stdout=open(os.devnull, "w"))
        services.stop(redis)


if __name__ == "__main__":
    main()
