"""How long a 2-node job takes on this machine: submission -> first line of a rank's output -> Completed.

Brings up everything it measures (its own database, Redis, Celery worker and local cluster on its own
bridge), runs the shipped example a few times, prints the numbers, and takes it all down again.

    .venv/bin/python bench/job_latency.py [--runs 5]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
BENCH_VAR = BASE_DIR / "var" / "bench-latency"
sys.path.insert(0, str(BASE_DIR))
os.environ.update(
    DJANGO_SETTINGS_MODULE="console.settings",
    CONSOLE_VAR_DIR=str(BENCH_VAR),
    NODE_WORK_ROOT="/var/lib/training-console/bench-jobs",
    LOCALCLUSTER_SUBNET="10.82.0.0/24",
    LOCALCLUSTER_BRIDGE="tcbenchbr",
    LOCALCLUSTER_PREFIX="tcbench",
    LOCALCLUSTER_STATE_DIR="/var/lib/training-console/bench-latency-cluster",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from console import services

    redis_port = services.free_port()
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
    BENCH_VAR.mkdir(parents=True, exist_ok=True)
    (BENCH_VAR / "console.sqlite3").unlink(missing_ok=True)

    import django

    from console.state import prepare

    prepare()  # var/, the secret key, the SQLite files: before the settings are read
    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from jobs.models import JobStatus, LogLine, ResourceSpec, TrainingJob
    from jobs.submission.forms import TrainingJobForm
    from jobs.submission.jobs import submit_job

    redis = services.start_redis(redis_port, BENCH_VAR / "redis.log")
    worker = None
    try:
        call_command("migrate", verbosity=0)
        call_command("seedconsole", password="bench", stdout=open(os.devnull, "w"))
        call_command("localcluster", "up", nodes=2, slots=2, stdout=open(os.devnull, "w"))
        worker = services.start_celery_worker({}, BENCH_VAR / "celery-worker.log")
        time.sleep(3)
        owner = get_user_model().objects.get(username="admin")
        spec = ResourceSpec.objects.get(name="local-cpu-2")
        to_first_line, to_completed = [], []
        for run in range(args.runs):
            form = TrainingJobForm(data={"name": f"latency-{run}", "engine": "MPI", "code_dir": "gpu-train",
                                         "boot_file": "train.py", "spec": spec.pk, "node_count": 2,
                                         "parameters": [{"name": "steps", "value": "5"}]})
            assert form.is_valid(), form.errors
            submitted = time.monotonic()
            job = submit_job(form, owner)
            first_line = None
            while True:
                if first_line is None and LogLine.objects.filter(job=job, rank__isnull=False).exists():
                    first_line = time.monotonic() - submitted
                status = TrainingJob.objects.values_list("status", flat=True).get(pk=job.pk)
                if status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.ABNORMAL):
                    break
                time.sleep(0.02)
            assert status == JobStatus.COMPLETED, f"run {run} ended {status}"
            to_first_line.append(first_line)
            to_completed.append(time.monotonic() - submitted)
            print(f"run {run}: first rank output after {first_line:.2f} s, Completed after {to_completed[-1]:.2f} s")
        print(
            f"2-node job, {args.runs} runs: submission -> first output median {statistics.median(to_first_line):.2f} s "
            f"(min {min(to_first_line):.2f}); submission -> Completed median {statistics.median(to_completed):.2f} s "
            f"(min {min(to_completed):.2f})"
        )
    finally:
        services.stop(worker)
        call_command("localcluster", "down", stdout=open(os.devnull, "w"))
        services.stop(redis)


if __name__ == "__main__":
    main()
