"""How many runs one Celery worker process can hold: its memory, CPU, threads and database connections
with 0, 1, half and all of its threads following a run, and how long stopping all of them at once takes.

Brings up its own console (database, Redis, one Celery worker of WORKER_THREADS = --runs threads, and a
local cluster of --runs namespace nodes with 1 slot each on bridge tccapbr, 10.90.0.0/24) and loads the
engine image on every node first (not timed). Each job is a 1-node program that prints one line a second
until it is stopped, as a long training job that logs its steps does. The worker's own figures with no
run are the floor each row is set beside: what a run adds is the row minus that floor, divided by its
runs. Then all are stopped at once, beside the floor of that: as many containers of the image removed at
once by hand. A run follows its job the whole time: it stores and reads back its log, beats its heartbeat,
probes its container every WORKER_PROBE_SECONDS and samples its resources every RESOURCE_SAMPLE_SECONDS.

    .venv/bin/python bench/worker_capacity.py [--runs 32] [--window 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import statistics
import time
from collections import Counter
from pathlib import Path

import benchkit

VAR = benchkit.environment("capacity", subnet="10.90.0.0/24", bridge="tccapbr", prefix="tccap")
HOLD = '''
import time
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
for second in range(3600):
    print(f"step={second} loss={1 / (second + 1):.4f} rank {rank}", flush=True)
    time.sleep(1)
'''


def submit(owner, name: str) -> int:
    from jobs.submission.forms import TrainingJobForm
    from jobs.submission.jobs import submit_job

    form = TrainingJobForm(data={"name": name, "engine": "MPI", "code_dir": "hold", "boot_file": "hold.py",
                                 "spec": "local-cpu-1", "node_count": 1})
    assert form.is_valid(), form.errors
    return submit_job(form, owner).pk


def wait_until(ids: list[int], status: str, deadline: float) -> None:
    """Until every job is in `status` and, when Running, has printed at least one line of its own."""
    from jobs.models import LogLine, TrainingJob

    while True:
        statuses = Counter(TrainingJob.objects.filter(pk__in=ids).values_list("status", flat=True))
        printed = LogLine.objects.filter(job_id__in=ids, text__startswith="step=").values("job_id").distinct().count()
        if statuses[status] == len(ids) and (status != "Running" or printed == len(ids)):
            return
        assert time.monotonic() < deadline, f"waiting for {status}: {dict(statuses)}, {printed} printing"
        time.sleep(0.5)


async def floor_of_the_stop(nodes, image: str) -> float:
    """The stop's floor: as many containers of the image (one a node), removed at once with `podman rm -f`
    and no grace; the seconds the removal took."""
    from jobs.runtime.ssh import connect, run_checked

    gate = asyncio.Semaphore(8)  # making them is not timed

    async def on_node(node, argv: list[str], step: str, gated: bool) -> None:
        target = node.ssh_target()
        async with await connect(target) as connection, gate if gated else contextlib.nullcontext():
            await run_checked(connection, target.label, step, argv)

    name = "capacity-floor"
    await asyncio.gather(*(on_node(node, ["podman", "run", "--detach", "--pull=never", "--name", name, "--network",
                                          "host", image, "sleep", "3600"], "starting the floor's container", True)
                           for node in nodes))
    started = time.monotonic()
    await asyncio.gather(*(on_node(node, ["podman", "rm", "--force", "--time", "0", name], "removing it", False)
                           for node in nodes))
    return time.monotonic() - started


def database_connections(pid: int, database: Path) -> int:
    """The worker's open handles on the SQLite file: one per database connection it holds."""
    found = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found += os.readlink(fd) == str(database)
        except OSError:
            continue
    return found


def measure(pid: int, database: Path, window: float) -> dict:
    cpu, busy, started = benchkit.cpu_seconds(pid), benchkit.busy_seconds(), time.monotonic()
    rss = []
    while time.monotonic() - started < window:
        rss.append(benchkit.rss_kib(pid))
        time.sleep(0.5)
    seconds = time.monotonic() - started
    return {"cpu": (benchkit.cpu_seconds(pid) - cpu) / seconds, "busy": (benchkit.busy_seconds() - busy) / seconds,
            "rss": max(rss) / 1024, "threads": benchkit.thread_count(pid),
            "connections": database_connections(pid, database)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--window", type=float, default=20.0, help="seconds each row is sampled over")
    args = benchkit.begin("worker_capacity", parser, 590)
    os.environ["WORKER_THREADS"] = str(args.runs)  # the one worker's threads: one per run

    with benchkit.Console(VAR, nodes=args.runs, slots=1) as console:
        from django.conf import settings
        from django.contrib.auth import get_user_model

        from jobs.code_dirs.service import register
        from jobs.images.recipes import MPI
        from jobs.models import JobEvent, Node, TrainingJob
        from jobs.runtime.node_images import console_archive
        from jobs.submission.jobs import stop_visible_job

        logging.getLogger("asyncssh").setLevel(logging.WARNING)
        code = VAR / "code" / "hold"
        code.mkdir(parents=True, exist_ok=True)
        (code / "hold.py").write_text(HOLD)
        register("hold", code, sharing="everyone")
        owner = get_user_model().objects.get(username="admin")
        archive = console_archive(MPI.reference)
        assert archive is not None, f"no archive of {MPI.reference}: run manage.py buildimages"
        started = time.monotonic()
        asyncio.run(benchkit.load_image_on_nodes(list(Node.objects.order_by("name")), MPI.reference, archive))
        print(f"image on {args.runs} nodes (podman load, not measured): {time.monotonic() - started:.0f} s", flush=True)
        pid, database = console.worker.pid, Path(settings.DATABASES["default"]["NAME"])
        time.sleep(3)  # the worker settles (imports, broker connection) before it is read

        rows, jobs = [], []
        for runs in sorted({0, 1, args.runs // 2, args.runs}):
            while len(jobs) < runs:
                jobs.append(submit(owner, f"hold-{len(jobs)}"))
            if jobs:
                wait_until(jobs, "Running", time.monotonic() + 180)
                time.sleep(3)  # past the preparation: a run that only follows its job
            rows.append((runs, measure(pid, database, args.window)))
            print(f"{runs} runs: {rows[-1][1]}", flush=True)

        stopping, busy = time.monotonic(), benchkit.busy_seconds()
        for job_id in jobs:
            stop_visible_job(owner, job_id)
        wait_until(jobs, "Terminated", time.monotonic() + 180)
        stopped_in = time.monotonic() - stopping
        stop_busy = (benchkit.busy_seconds() - busy) / stopped_in
        lines = sum(TrainingJob.objects.filter(pk__in=jobs).values_list("log_line_count", flat=True))
        asked = dict(JobEvent.objects.filter(job_id__in=jobs, kind="state:Terminating").values_list("job_id", "at"))
        ended = dict(JobEvent.objects.filter(job_id__in=jobs, kind="state:Terminated").values_list("job_id", "at"))
        each = sorted((ended[pk] - asked[pk]).total_seconds() for pk in jobs)
        floor_seconds = asyncio.run(floor_of_the_stop(list(Node.objects.order_by("name")), MPI.reference))

    floor = rows[0][1]
    table = []
    for runs, found in rows:
        added = {key: (found[key] - floor[key]) / runs for key in ("rss", "cpu")} if runs else {}
        table.append([str(runs), f"{found['rss']:.0f}", f"{added['rss']:.2f}" if runs else "-",
                      f"{found['cpu'] * 100:.1f}", f"{added['cpu'] * 100:.2f}" if runs else "-",
                      str(found["threads"]), str(found["connections"]), f"{found['busy'] * 100:.0f}"])
    print(f"\none Celery worker of {args.runs} threads, {args.runs} nodes x 1 slot, each run a job printing a line "
          f"a second; rows sampled over {args.window:.0f} s; {benchkit.load_line()} at the end")
    print(benchkit.table(["runs followed", "worker RSS MiB", "per run MiB", "worker CPU % of a core", "per run %",
                          "worker threads", "database connections", f"machine busy % (of {os.cpu_count() * 100})"],
                         table))
    print(f"the first row is the floor (the same worker following nothing); all {len(jobs)} stopped at once: "
          f"the last Terminated {stopped_in:.1f} s after the first stop request (each job's stop -> Terminated p50 "
          f"{statistics.median(each):.1f} s, max {each[-1]:.1f} s; the machine {stop_busy * 100:.0f}% busy of "
          f"{os.cpu_count() * 100} meanwhile: the nodes' podman ending the containers); its floor, as many "
          f"containers of the image (one a node) removed at once with `podman rm -f --time 0`: "
          f"{floor_seconds:.1f} s; {lines:,} log lines in all")


if __name__ == "__main__":
    main()
