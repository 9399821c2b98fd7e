"""What the console adds to a job's launch, against mpirun started by hand in the same containers.

Brings up its own console (database, Redis, Celery worker, web server under uvicorn, and a local
cluster of 2 nodes on bridge tcovhbr, 10.86.0.0/24), loads the engine image on both nodes (image
distribution is not what is measured), then runs the shipped example (examples/gpu-train/train.py,
2 nodes x 2 slots, 5 steps) alternately:

- bare: the job's plan computed as the runtime computes it; on each node, by hand over SSH, the
  runtime's bundle and code archive uploaded in one SFTP session, prepare-workdir.sh, and the
  container started with the runtime's own `podman run` argv (jobs.runtime.containers.run_argv), its
  sshd port awaited; then the plan's exact mpirun command run over SSH in worker-0's container.
  Timed from "submission" (the job row created) to the first line of a rank, and to mpirun's exit;
  the containers are removed after (timed apart).
- console: submitted through the API (POST /api/v1/training-jobs), followed through the API
  (/log/lines, polled every 50 ms): submission -> first line of a rank in the log, -> Completed.

Then one console job's stages from its log lines (LogLine.at), its events (JobEvent.at) and the
Celery worker's own log (asyncssh logs every connection, command and exit status with a time),
beside the bare run's own steps, and a probe of the teardown: two more bare runs (not counted) end
their containers with the runtime's stop-worker.sh under `sh -x`, to show how often its wait loop goes
round and what it counts. It changes nothing in the console: it measures it.

    .venv/bin/python bench/launch_overhead.py [--runs 5] [--steps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import logging
import re
import shlex
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import benchkit

VAR = benchkit.environment("launch", subnet="10.86.0.0/24", bridge="tcovhbr", prefix="tcovh")
RANK_TAG = re.compile(r"^\[\d+,(\d+)\]<(stdout|stderr)>:")
POLL_SECONDS = 0.05
JOB_TIMEOUT = 120


def api(port: int, token: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    connection.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = connection.getresponse()
    data = json.loads(response.read() or b"{}")
    connection.close()
    return response.status, data


def console_run(port: int, token: str, name: str, steps: int) -> dict:
    """Submit through the API and follow the job through the API until it ends."""
    body = {"name": name, "engine": "MPI", "code_dir": "gpu-train", "boot_file": "train.py", "spec": "local-cpu-2",
            "node_count": 2, "parameters": [{"name": "steps", "value": str(steps)}]}
    submitted_wall = datetime.now(UTC)
    submitted = time.monotonic()
    code, job = api(port, token, "POST", "/api/v1/training-jobs", body)
    assert code == 201, (code, job)
    accepted = time.monotonic() - submitted
    after, first, status = 0, None, ""
    deadline = submitted + JOB_TIMEOUT
    while time.monotonic() < deadline:
        code, page = api(port, token, "GET", f"/api/v1/training-jobs/{job['id']}/log/lines?after={after}&system=0")
        assert code == 200, (code, page)
        if first is None and any(line["rank"] is not None for line in page["lines"]):
            first = time.monotonic() - submitted
        after, status = page["next"] or after, page["status"]
        if status in ("Completed", "Failed", "Terminated", "Abnormal"):
            break
        if not page["more"]:
            time.sleep(POLL_SECONDS)
    ended = time.monotonic() - submitted
    assert status == "Completed", f"console job {job['id']} ended {status or 'never'}"
    return {"id": job["id"], "submitted_at": submitted_wall, "accepted": accepted, "first": first, "end": ended}


# What stop-worker.sh counts in a container while it waits for the ranks to go (it stops at 3 or fewer).
COUNT = "ls -d /proc/[0-9]* | wc -l"


# What is in the container: each process's name and state, read by one shell (nothing else of the probe's runs).
LIST = 'for p in /proc/[0-9]*; do read -r c < "$p/comm"; set -- $(cat "$p/stat"); echo "${p#/proc/}:$c:$3"; done'


async def probe_and_stop(plan, worker, reads: int) -> dict:
    """After mpirun's exit: the container's processes and `reads` times what the stop script's process count
    reads; then the script itself, traced (`sh -x`: how often it went round its wait loop, and the count each
    time) and timed. With reads=0 the script runs at once, as the console runs it."""
    from jobs.runtime.ssh import connect
    from jobs.runtime.teardown import STOP_SCRIPT

    counts, processes = [], ""
    async with await connect(worker.node) as connection:
        if reads:
            listed = await connection.run(shlex.join(["podman", "exec", worker.container_name, "sh", "-c", LIST]),
                                          check=False)
            processes = " ".join(str(listed.stdout).split())
        for _ in range(reads):
            started = time.monotonic()
            result = await connection.run(shlex.join(["podman", "exec", worker.container_name, "sh", "-c", COUNT]),
                                          check=False)
            counts.append((str(result.stdout).strip(), time.monotonic() - started))
        started = time.monotonic()
        result = await connection.run(shlex.join(["sh", "-x", "-s", "--", worker.workdir, worker.container_name]),
                                      input=STOP_SCRIPT, check=False)
        script = time.monotonic() - started
    trace = str(result.stderr)
    return {"counts": counts, "processes": processes, "script": script,
            "left": str(result.stdout).strip().splitlines()[-1:],
            "loop_counts": re.findall(r"\+ \[ (\d+) -le 3 \]", trace), "sleeps": trace.count("+ sleep 0.1")}


async def bare_run(owner, nodes, name: str, steps: int, probe: int | None = None) -> dict:
    import asyncssh

    from jobs.runtime.preparation import write_code_archive
    from jobs.runtime.ssh import connect

    submitted = time.monotonic()
    plan = await asyncio.to_thread(benchkit.bare_plan, owner, nodes, {
        "name": name, "engine": "MPI", "code_dir": "gpu-train", "boot_file": "train.py", "spec": "local-cpu-2",
        "node_count": 2, "parameters": [{"name": "steps", "value": str(steps)}]})
    result: dict = {"plan": time.monotonic() - submitted}
    with tempfile.TemporaryDirectory() as scratch:
        code_archive = Path(scratch) / "code.tar"
        write_code_archive(plan, code_archive)
        result["workers"] = await asyncio.gather(
            *(benchkit.prepare_by_hand(plan, worker, code_archive, Path(scratch)) for worker in plan.workers))
    result["prepared"] = time.monotonic() - submitted
    try:
        command = f"cd {shlex.quote(plan.working_dir)} && exec {shlex.join(plan.argv)}"
        launched = time.monotonic()
        async with await connect(plan.container_target(plan.workers[0])) as connection:
            result["connect"] = time.monotonic() - launched
            process = await connection.create_process(command, stderr=asyncssh.STDOUT)
            first = last = None
            async for line in process.stdout:
                if RANK_TAG.match(line):
                    last = time.monotonic() - submitted
                    first = first or last
            await process.wait()
        result["end"] = time.monotonic() - submitted
        result.update(first=first, last=last, exit=process.exit_status, launched=launched - submitted)
        assert process.exit_status == 0, f"bare mpirun exited {process.exit_status}"
    finally:
        removing = time.monotonic()
        if probe is not None:
            result["probe"] = await asyncio.gather(*(probe_and_stop(plan, worker, probe)
                                                     for worker in plan.workers))
        else:
            await asyncio.gather(*(benchkit.remove_by_hand(plan, worker) for worker in plan.workers))
        result["teardown"] = time.monotonic() - removing
    return result


def console_timeline(run: dict, worker_log: Path) -> list[list[str]]:
    """One console job's stages, each with its start and end (seconds after the API submission)."""
    from jobs.models import Worker

    job_id = run["id"]
    t0 = run["submitted_at"]
    marks = benchkit.job_marks(job_id)
    first, last = benchkit.first_at, benchkit.last_at
    workers = list(Worker.objects.filter(job_id=job_id).order_by("index"))
    index_of = {worker.address: worker.index for worker in workers}
    ups = {worker.index: first(marks, f"line: worker-{worker.index} container ") for worker in workers}
    creating, completed = first(marks, "event state:Creating"), first(marks, "event state:Completed")
    training_end = first(marks, "line: Training end")
    removed = max((mark.at for mark in marks if mark.what.endswith(": container removed, no process left")),
                  default=None)
    connections = benchkit.ssh_connections(worker_log, creating, completed)
    rows = []

    def row(name: str, start, end) -> None:
        rows.append([name, benchkit.fmt(benchkit.seconds(t0, start)), benchkit.fmt(benchkit.seconds(t0, end)),
                     benchkit.fmt(benchkit.seconds(start, end))])

    def steps_of(connection, prefix: str = "  ") -> None:
        for step in connection.steps:
            row(f"{prefix}{step.name}", step.start, step.end)

    row("API POST -> job saved (state:Pending event)", t0, first(marks, "event state:Pending"))
    row("allocation: Pending -> Creating (dispatch task via Celery)", first(marks, "event state:Pending"), creating)
    row("run task picked up, plan, keys: Creating -> 'Preparing' line", creating, first(marks, "line: Preparing "))
    for worker in workers:
        row(f"worker-{worker.index} ({worker.node_name}): 'preparing' -> 'is up' lines",
            first(marks, f"line: preparing worker-{worker.index} "), ups[worker.index])
        ended = None
        for connection in connections:
            if connection.address == worker.address and connection.port == 22 and \
                    connection.opened <= (ups[worker.index] or completed):
                steps_of(connection)
                ended = max([step.end for step in connection.steps if step.end] + ([ended] if ended else []))
        row("  sshd port open (polled every 20 ms) + 'is up' line", ended, ups[worker.index])
    row("last 'is up' -> state:Running (status check, start())", max(filter(None, ups.values()), default=None),
        first(marks, "event state:Running"))
    row("state:Running -> 'Launching' line", first(marks, "event state:Running"), first(marks, "line: Launching"))
    for connection in connections:
        if connection.port != 22:
            row("  SSH connect into worker-0's container", connection.steps[0].start, connection.steps[0].end)
    row("'Launching' -> first rank line read", first(marks, "line: Launching"), first(marks, "first rank line"))
    row("first -> last rank line read (the training)", first(marks, "first rank line"), last(marks, "last rank line"))
    row("last rank line -> 'Training end' line (mpirun's exit seen)", last(marks, "last rank line"), training_end)
    row("teardown: 'Training end' -> last 'container removed' line", training_end, removed)
    for connection in connections:
        if connection.port == 22 and training_end and connection.opened >= training_end:
            steps_of(connection, f"  worker-{index_of.get(connection.address)} ")
    row("recording, release, settle -> state:Completed", removed, completed)
    row("state:Completed -> Completed seen by the API (poll)", completed, t0 + timedelta(seconds=run["end"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = benchkit.begin("launch_overhead", parser, 540)

    with benchkit.Console(VAR, nodes=2, slots=2, web=True) as console:
        from django.contrib.auth import get_user_model

        from jobs.images.recipes import MPI
        from jobs.models import ApiToken, Node
        from jobs.runtime.node_images import console_archive

        logging.getLogger("asyncssh").setLevel(logging.WARNING)  # quiet here; the Celery worker logs its own
        owner = get_user_model().objects.get(username="admin")
        token = ApiToken.issue(owner, "bench")[1]
        nodes = list(Node.objects.order_by("name"))
        archive = console_archive(MPI.reference)
        assert archive is not None, f"no archive of {MPI.reference}: run manage.py buildimages"
        loads = asyncio.run(benchkit.load_image_on_nodes(nodes, MPI.reference, archive))
        print(f"image {MPI.reference} on both nodes (podman load, not measured): "
              f"{', '.join(f'{s:.1f} s' for s in loads)}", flush=True)
        # One of each first, not counted: caches (page cache, Python's bytecode in the image) warm.
        warmup = asyncio.run(bare_run(owner, nodes, "bare-warmup", args.steps, probe=0))
        console_run(console.web_port, token, "console-warmup", args.steps)

        bare, through = [], []
        for index in range(args.runs):
            bare.append(asyncio.run(bare_run(owner, nodes, f"bare-{index}", args.steps)))
            through.append(console_run(console.web_port, token, f"console-{index}", args.steps))
            print(f"run {index}: bare first rank line {bare[-1]['first']:.2f} s, mpirun exit {bare[-1]['end']:.2f} s"
                  f" | console first rank line {through[-1]['first']:.2f} s, Completed {through[-1]['end']:.2f} s",
                  flush=True)

        removed = [{"done": run["end"] + run["teardown"]} for run in bare]

        def median(runs: list[dict], key: str) -> float:
            return statistics.median(run[key] for run in runs)

        print(f"\n2 nodes x 2 slots, examples/gpu-train/train.py --steps={args.steps}, {args.runs} alternating runs "
              f"(medians; min-max in brackets); {benchkit.load_line()} at the end")

        def spread(runs: list[dict], key: str) -> str:
            values = [run[key] for run in runs]
            return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

        print(benchkit.table(
            ["figure", "bare: by hand, same containers", "console: API", "difference"],
            [["submission -> first rank line", spread(bare, "first"), spread(through, "first"),
              f"{median(through, 'first') - median(bare, 'first'):+.2f}"],
             ["submission -> end (bare: mpirun exit; console: Completed via API)", spread(bare, "end"),
              spread(through, "end"), f"{median(through, 'end') - median(bare, 'end'):+.2f}"],
             ["submission -> containers removed (bare: podman rm -f; console: Completed via API)",
              spread(removed, "done"), spread(through, "end"),
              f"{median(through, 'end') - median(removed, 'done'):+.2f}"]]))
        print("bare, of which (medians): plan + job row {:.3f} s; containers up (both nodes, parallel) {:.2f} s; "
              "SSH into worker-0's container {:.3f} s; then mpirun to its first rank line {:.2f} s and to its exit "
              "{:.2f} s; container removal after (not in the figures) {:.2f} s".format(
                  median(bare, "plan"), median(bare, "prepared"), median(bare, "connect"),
                  statistics.median(run["first"] - run["launched"] for run in bare),
                  statistics.median(run["end"] - run["launched"] for run in bare), median(bare, "teardown")))
        steps = list(bare[0]["workers"][0])
        print(benchkit.table(["bare preparation step (per worker, median of runs)", "worker-0 s", "worker-1 s"],
                             [[step, *(f"{statistics.median(run['workers'][w][step] for run in bare):.3f}"
                                       for w in range(2))] for step in steps]))

        probed = asyncio.run(bare_run(owner, nodes, "bare-probe", args.steps, probe=4))
        print("\nteardown probe (2 extra bare runs, not counted), after mpirun's exit: stop-worker.sh under sh -x, "
              "as the console runs it (it goes round while more than the container's first process and its own shell "
              "are left, at most 20 times, sleeping 0.1 s): "
              "in the warm-up at once, in the run after only once the container's processes were listed and "
              f"its count `podman exec NAME sh -c '{COUNT}'` read 4 times")
        print(benchkit.table(
            ["run", "worker", "counts read first", "podman exec s (each)", "stop-worker.sh s", "times round",
             "its counts", "last line"],
            [[label, f"worker-{index}", " ".join(count for count, _ in entry["counts"]) or "-",
              " ".join(f"{took:.2f}" for _, took in entry["counts"]) or "-", f"{entry['script']:.2f}",
              str(entry["sleeps"]), " ".join(entry["loop_counts"]), " ".join(entry["left"])]
             for label, run in (("warm-up", warmup), ("after", probed)) for index, entry in enumerate(run["probe"])]))
        for index, entry in enumerate(probed["probe"]):
            print(f"  worker-{index}'s container after mpirun's exit (pid:name:state): {entry['processes']}")
        teardowns = []
        for run in through:
            marks = benchkit.job_marks(run["id"])
            connections = benchkit.ssh_connections(console.worker_log, benchkit.first_at(marks, "line: Training end"),
                                                   benchkit.first_at(marks, "event state:Completed"))
            teardowns.append(" ".join(benchkit.fmt(step.seconds) for connection in connections
                                      for step in connection.steps if step.name.startswith("teardown")))
        print("console teardown, stop-worker.sh per worker (s), each timed run: " + " | ".join(teardowns))

        chosen = sorted(through, key=lambda run: run["end"])[len(through) // 2]
        rows = console_timeline(chosen, console.worker_log)
        print(f"\nstage timeline of console job {chosen['id']} (the median run by Completed), seconds after the "
              "API submission; from LogLine.at, JobEvent.at and the Celery worker's asyncssh log")
        print(benchkit.table(["stage", "start", "end", "took"], rows))


if __name__ == "__main__":
    main()
