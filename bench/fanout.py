"""How node preparation scales with the number of nodes: 1, 4, 8 and 16 nodes, as a ratio to 1 node.

Brings up its own console (database, Redis, Celery worker, and a local cluster of 16 namespace nodes
with 1 slot each on bridge tcfanbr, 10.87.0.0/24) and loads the engine image on every node first
(`podman load` once per node, before anything is timed: image distribution is not what is measured).
Then it runs the shipped example (examples/gpu-train/train.py, 1 step, one rank per node) on 1, 4, 8
and 16 nodes, the sizes taking turns, and reads each job's preparation back from its own log: from its
first "preparing worker" line to its last "is up" line (LogLine.at), and from state:Creating to
state:Running (JobEvent.at). The goal: 16 nodes in at most 1.5 x the time of 1 node. For the largest
size it also breaks the preparation into its steps on each node, from the Celery worker's asyncssh log,
and it samples CPU time meanwhile: the Celery worker's own (the console's side: SSH, SFTP, the database,
all of one job's nodes in one event loop) and the whole machine's. Here the 16 "nodes" share this
machine's cores, so their podman and sshd work competes with the console's as it would not on real hosts.

    .venv/bin/python bench/fanout.py [--runs 3] [--sizes 1,4,8,16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from datetime import UTC, datetime

import benchkit

VAR = benchkit.environment("fanout", subnet="10.87.0.0/24", bridge="tcfanbr", prefix="tcfan")
GOAL = 1.5
JOB_TIMEOUT = 240


def run_job(owner, nodes: int, name: str, worker_pid: int) -> tuple[int, list]:
    """Run the job to its end; returns its id and (time, Celery worker CPU s, machine busy CPU s) every 50 ms."""
    from jobs.models import FINAL_STATES, JobStatus, TrainingJob
    from jobs.submission.forms import TrainingJobForm
    from jobs.submission.jobs import submit_job

    form = TrainingJobForm(data={"name": name, "engine": "MPI", "code_dir": "gpu-train", "boot_file": "train.py",
                                 "spec": "local-cpu-1", "node_count": nodes,
                                 "parameters": [{"name": "steps", "value": "1"}]})
    assert form.is_valid(), form.errors
    samples = []
    job = submit_job(form, owner)
    deadline = time.monotonic() + JOB_TIMEOUT
    status, polls = JobStatus.PENDING, 0
    while status not in FINAL_STATES:
        assert time.monotonic() < deadline, f"job {job.pk} ({nodes} nodes) still {status} after {JOB_TIMEOUT} s"
        samples.append((datetime.now(UTC), benchkit.cpu_seconds(worker_pid), benchkit.busy_seconds()))
        polls += 1
        if polls % 4 == 0:
            status = TrainingJob.objects.values_list("status", flat=True).get(pk=job.pk)
        time.sleep(0.05)
    assert status == JobStatus.COMPLETED, f"job {job.pk} ({nodes} nodes) ended {status}"
    return job.pk, samples


def at_time(samples: list, moment: datetime, column: int) -> float:
    """A sampled counter at `moment`, interpolated between the samples around it."""
    before = max((sample for sample in samples if sample[0] <= moment), key=lambda sample: sample[0], default=samples[0])
    after = min((sample for sample in samples if sample[0] >= moment), key=lambda sample: sample[0], default=samples[-1])
    span = (after[0] - before[0]).total_seconds()
    share = (moment - before[0]).total_seconds() / span if span > 0 else 0.0
    return before[column] + (after[column] - before[column]) * share


def preparation(job_id: int, samples: list) -> dict:
    marks = benchkit.job_marks(job_id)
    first_preparing = benchkit.first_at(marks, "line: preparing worker-")
    up = [mark.at for mark in marks if mark.what.startswith("line: worker-") and " is up, sshd on port " in mark.what]
    return {
        "lines": benchkit.seconds(first_preparing, max(up)),
        "events": benchkit.seconds(benchkit.first_at(marks, "event state:Creating"),
                                   benchkit.first_at(marks, "event state:Running")),
        "console_cpu": at_time(samples, max(up), 1) - at_time(samples, first_preparing, 1),
        "machine_cpu": at_time(samples, max(up), 2) - at_time(samples, first_preparing, 2),
        "first_preparing": first_preparing, "last_up": max(up), "first_up": min(up),
    }


def step_breakdown(job_id: int, found: dict, worker_log) -> list[list[str]]:
    """Each preparation step over the job's nodes: median and slowest, and when the nodes began and ended it."""
    connections = [connection for connection in benchkit.ssh_connections(worker_log, found["first_preparing"],
                                                                          found["last_up"])
                   if connection.port == 22]
    by_step: dict[str, list] = {}
    for connection in connections:
        for step in connection.steps:
            by_step.setdefault(step.name, []).append(step)
    t0 = found["first_preparing"]
    rows = []
    for name, steps in by_step.items():
        took = [step.seconds for step in steps if step.seconds is not None]
        starts = [benchkit.seconds(t0, step.start) for step in steps]
        ends = [benchkit.seconds(t0, step.end) for step in steps if step.end]
        rows.append([name, str(len(steps)), benchkit.fmt(statistics.median(took), 3), benchkit.fmt(max(took), 3),
                     f"{min(starts):.2f}-{max(starts):.2f}", f"{min(ends):.2f}-{max(ends):.2f}"])
    rows.append(["sshd port open -> 'is up' line (each node)", str(len(connections)), "", "",
                 "", f"{benchkit.seconds(t0, found['first_up']):.2f}-{benchkit.seconds(t0, found['last_up']):.2f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="1,4,8,16")
    parser.add_argument("--time-limit", type=int, default=570, help="seconds before everything is taken down")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    print(f"fanout: {benchkit.load_line()} at the start; test runs: {benchkit.test_runs()}", flush=True)
    benchkit.time_limit(args.time_limit)

    with benchkit.Console(VAR, nodes=max(sizes), slots=1) as console:
        from django.contrib.auth import get_user_model

        from jobs.images.recipes import MPI
        from jobs.models import Node
        from jobs.runtime.node_images import console_archive

        owner = get_user_model().objects.get(username="admin")
        archive = console_archive(MPI.reference)
        assert archive is not None, f"no archive of {MPI.reference}: run manage.py buildimages"
        started = time.monotonic()
        loads = asyncio.run(benchkit.load_image_on_nodes(list(Node.objects.order_by("name")), MPI.reference, archive))
        print(f"image loaded on {len(loads)} nodes before timing (podman load, 4 at a time; not measured): "
              f"{time.monotonic() - started:.0f} s in all, {statistics.median(loads):.1f} s a node (median)", flush=True)
        run_job(owner, 1, "fanout-warmup", console.worker.pid)  # not counted

        found: dict[int, list[dict]] = {size: [] for size in sizes}
        ids: dict[int, list[int]] = {size: [] for size in sizes}
        for run in range(args.runs):
            for size in sizes:
                job_id, samples = run_job(owner, size, f"fanout-{size}-{run}", console.worker.pid)
                ids[size].append(job_id)
                found[size].append(preparation(job_id, samples))
                print(f"run {run}, {size:2d} node(s): job {job_id}, preparation {found[size][-1]['lines']:.2f} s "
                      f"(lines), Creating -> Running {found[size][-1]['events']:.2f} s; CPU meanwhile: Celery worker "
                      f"{found[size][-1]['console_cpu']:.2f} s, machine {found[size][-1]['machine_cpu']:.2f} s",
                      flush=True)

        def median(size: int, key: str) -> float:
            return statistics.median(entry[key] for entry in found[size])

        base_lines, base_events = median(sizes[0], "lines"), median(sizes[0], "events")
        rows = []
        for size in sizes:
            values = [entry["lines"] for entry in found[size]]
            rows.append([str(size), f"{median(size, 'lines'):.2f} ({min(values):.2f}-{max(values):.2f})",
                         f"{median(size, 'lines') / base_lines:.2f}", f"{median(size, 'events'):.2f}",
                         f"{median(size, 'events') / base_events:.2f}", f"{median(size, 'console_cpu'):.2f}",
                         f"{median(size, 'machine_cpu'):.2f}"])
        print(f"\nnode preparation, medians of {args.runs} runs (min-max); {benchkit.load_line()} at the end")
        print(benchkit.table(["nodes", "first 'preparing' -> last 'is up' s", f"ratio to {sizes[0]}",
                              "Creating -> Running s", f"ratio to {sizes[0]}", "Celery worker CPU s",
                              "machine busy CPU s"], rows))
        print(f"(CPU during the preparation, first 'preparing' -> last 'is up': the console's Celery worker process, "
              f"and every process on this machine's {os.cpu_count()} cores, the nodes' podman and sshd included)")
        largest = max(sizes)
        ratio = median(largest, "lines") / base_lines
        print(f"goal {largest} nodes <= {GOAL} x {sizes[0]} node: {'MET' if ratio <= GOAL else 'NOT MET'} "
              f"({ratio:.2f} x by the log lines, {median(largest, 'events') / base_events:.2f} x by the events)")
        for size in sorted({sizes[0], largest}):
            pick = sorted(range(args.runs), key=lambda run: found[size][run]["lines"])[args.runs // 2]
            print(f"\nsteps of the {size}-node job {ids[size][pick]} (its median run), seconds after its first "
                  "'preparing' line, from the Celery worker's asyncssh log")
            print(benchkit.table(["step", "nodes", "median s", "slowest s", "began", "ended"],
                                 step_breakdown(ids[size][pick], found[size][pick], console.worker_log)))


if __name__ == "__main__":
    main()
