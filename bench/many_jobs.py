"""Many jobs at once: 50 one-node jobs submitted together on 16 nodes with 2 Celery workers, against the same
50 one after another.

Brings up its own console (database, Redis, two Celery workers of 16 threads each, and a local cluster
of 16 namespace nodes with 1 slot each on bridge tcmanybr, 10.89.0.0/24) and loads the engine image on
every node first (not timed). Then it runs the shipped example (examples/gpu-train/train.py, 1 step) as
1-node jobs: first all 50 submitted at once, then 50 more one after another (each submitted when the
one before ended). It checks that every job ended Completed and that no two jobs held one node at the
same time: from the Worker rows (which node each job ran on) and each job's times, both from Running to
its end (started_at -> ended_at) and, stricter, from its allocation (the state:Creating event) to its end.
Meanwhile it samples which Celery worker process follows each run (`run_owner`) to show how many runs
one process held at once.

    .venv/bin/python bench/many_jobs.py [--jobs 50] [--nodes 16]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time
from collections import Counter, defaultdict

import benchkit

VAR = benchkit.environment("many", subnet="10.89.0.0/24", bridge="tcmanybr", prefix="tcmany")
FINAL = ("Completed", "Failed", "Terminated", "Abnormal")


def submit(owner, name: str) -> int:
    from jobs.submission.forms import TrainingJobForm
    from jobs.submission.jobs import submit_job

    form = TrainingJobForm(data={"name": name, "engine": "MPI", "code_dir": "gpu-train", "boot_file": "train.py",
                                 "spec": "local-cpu-1", "node_count": 1, "parameters": [{"name": "steps", "value": "1"}]})
    assert form.is_valid(), form.errors
    return submit_job(form, owner).pk


def wait_all(ids: list[int], deadline: float, samples: list | None = None) -> None:
    """Until every job is in a final state; `samples` gets (time, jobs Creating or Running, runs per owner process)."""
    from jobs.models import TrainingJob

    while True:
        rows = list(TrainingJob.objects.filter(pk__in=ids).values_list("status", "run_owner"))
        if samples is not None:
            live = [owner for status, owner in rows if status in ("Creating", "Running", "Terminating")]
            # run_owner is "host:pid:nonce": the process is the host and pid.
            samples.append((time.monotonic(), len(live), Counter(":".join(owner.split(":")[:2]) for owner in live if owner)))
        if all(status in FINAL for status, _ in rows):
            return
        assert time.monotonic() < deadline, f"jobs still running at the deadline: {Counter(s for s, _ in rows)}"
        time.sleep(0.2)


def overlaps(ids: list[int]) -> dict:
    """Pairs of jobs whose Worker rows name one node and whose times on it overlap: from Running to the end,
    and from the allocation (state:Creating) to the end; for each pair, by how much, and whether the earlier
    job's container was already removed (its "container removed" line) when the later one was allocated."""
    from jobs.models import JobEvent, LogLine, TrainingJob, Worker

    jobs = {job.pk: job for job in TrainingJob.objects.filter(pk__in=ids)}
    creating = {event.job_id: event.at for event in JobEvent.objects.filter(job_id__in=ids, kind="state:Creating")
                .order_by("at")}
    removed = {}
    for line in LogLine.objects.filter(job_id__in=ids, stream="system", text__contains="container removed"):
        removed[line.job_id] = max(removed.get(line.job_id, line.at), line.at)
    by_node = defaultdict(list)
    for worker in Worker.objects.filter(job_id__in=ids):
        by_node[worker.node_name].append(worker.job_id)
    found = {"running": [], "allocated": [], "nodes_used": len(by_node), "workers": sum(map(len, by_node.values()))}
    for node, job_ids in by_node.items():
        for kind, start in (("running", lambda job: job.started_at), ("allocated", lambda job: creating.get(job.pk))):
            spans = sorted((start(jobs[pk]), jobs[pk].ended_at, pk) for pk in job_ids)
            if any(begin is None or end is None for begin, end, _pk in spans):
                found[kind].append((node, "a job without its times", "", 0.0, False))
                continue
            latest = None  # the span before that reaches furthest: any later start before its end overlaps it
            for begin, end, pk in spans:
                if latest and begin < latest[1]:
                    gone = latest[2] in removed and removed[latest[2]] <= begin
                    found[kind].append((node, latest[2], pk, (latest[1] - begin).total_seconds(), gone))
                if latest is None or end > latest[1]:
                    latest = (begin, end, pk)
    return found


def summary(ids: list[int], submitted: dict[int, float], t0_wall) -> dict:
    from jobs.models import TrainingJob

    jobs = list(TrainingJob.objects.filter(pk__in=ids))
    ends = [(job.ended_at - t0_wall).total_seconds() for job in jobs]
    turnaround = [(job.ended_at - job.created_at).total_seconds() for job in jobs]
    return {"statuses": Counter(job.status for job in jobs), "drain": max(ends), "turnaround": turnaround}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=16)
    args = benchkit.begin("many_jobs", parser, 590)
    os.environ["RUN_SLOTS"] = "32"  # the two workers' threads

    with benchkit.Console(VAR, nodes=args.nodes, slots=1):
        from datetime import UTC, datetime

        from django.contrib.auth import get_user_model

        from console import services
        from jobs.images.recipes import MPI
        from jobs.models import Node
        from jobs.runtime.node_images import console_archive

        logging.getLogger("asyncssh").setLevel(logging.WARNING)  # quiet here; the Celery workers log their own
        second = services.start_celery_worker({}, VAR / "celery-worker-2.log")
        try:
            owner = get_user_model().objects.get(username="admin")
            archive = console_archive(MPI.reference)
            assert archive is not None, f"no archive of {MPI.reference}: run manage.py buildimages"
            started = time.monotonic()
            loads = asyncio.run(benchkit.load_image_on_nodes(list(Node.objects.order_by("name")), MPI.reference,
                                                             archive))
            print(f"image on {len(loads)} nodes (podman load, not measured): {time.monotonic() - started:.0f} s",
                  flush=True)
            warm = submit(owner, "warmup")
            wait_all([warm], time.monotonic() + 120)

            samples: list = []
            t0, t0_wall = time.monotonic(), datetime.now(UTC)
            together = [submit(owner, f"together-{index}") for index in range(args.jobs)]
            submitted_in = time.monotonic() - t0
            wait_all(together, t0 + 300, samples)
            at_once = summary(together, {}, t0_wall)
            at_once_overlaps = overlaps(together)
            print(f"together: {args.jobs} submitted in {submitted_in:.1f} s, drained in {at_once['drain']:.1f} s, "
                  f"{dict(at_once['statuses'])}", flush=True)

            t1_wall = datetime.now(UTC)
            serial = []
            for index in range(args.jobs):
                serial.append(submit(owner, f"serial-{index}"))
                wait_all(serial[-1:], time.monotonic() + 120)
            one_by_one = summary(serial, {}, t1_wall)
            print(f"one after another: drained in {one_by_one['drain']:.1f} s, {dict(one_by_one['statuses'])}",
                  flush=True)
        finally:
            services.stop(second)

        peak = max(live for _t, live, _owners in samples)
        per_process = Counter()
        for _t, _live, owners in samples:
            for process, count in owners.items():
                per_process[process] = max(per_process[process], count)
        rows = []
        for label, found, gaps in (("50 submitted at once", at_once, at_once_overlaps),
                                   ("50 one after another", one_by_one, overlaps(serial))):
            rows.append([label.replace("50", str(args.jobs)), f"{found['drain']:.1f}",
                         f"{statistics.median(found['turnaround']):.1f} / {max(found['turnaround']):.1f}",
                         ", ".join(f"{n} {s}" for s, n in found["statuses"].items()),
                         f"{gaps['nodes_used']} nodes, {gaps['workers']} workers",
                         f"{len(gaps['running'])} / {len(gaps['allocated'])}",
                         str(sum(1 for *_, gone in gaps["allocated"] if not gone))])
        print(f"\n{args.jobs} 1-node jobs (examples/gpu-train/train.py --steps=1) on {args.nodes} nodes x 1 slot, "
              f"2 Celery workers x 16 threads; {benchkit.load_line()} at the end")
        print(benchkit.table(["run", "drain s (first submission -> last end)", "submission -> end p50 / max s",
                              "ended", "Worker rows", "overlaps (Running->end / allocation->end)",
                              "of which the earlier container was still there"], rows))
        held = ", ".join(f"{count} (pid {process.rsplit(':', 1)[-1]})" for process, count in per_process.items())
        print(f"together: at most {peak} jobs Creating or Running at once; the most runs one Celery worker process "
              f"followed at once: {held}; "
              f"speed-up {one_by_one['drain'] / at_once['drain']:.2f} x")
        for kind in ("running", "allocated"):
            for node, a, b, seconds, gone in at_once_overlaps[kind][:10]:
                print(f"  overlap ({kind}) on {node}: job {b} began {seconds * 1000:.1f} ms before job {a}'s end was "
                      f"recorded; job {a}'s container {'was removed before' if gone else 'was NOT removed before'} "
                      f"job {b} was allocated")


if __name__ == "__main__":
    main()
