"""How fast one job's output flows from its ranks into storage and out to a live follower, against the same
program's own rate with its output thrown away, and what the flow costs the console in memory.

Brings up its own console (database, Redis, Celery worker, web server under uvicorn and a local cluster
of 2 nodes x 2 slots on bridge tclogbr, 10.88.0.0/24) and loads the engine image on both nodes (not
timed). Then:

- a 2-node job whose 4 ranks print as fast as they can, each line with the time it was printed, followed
  live over Server-Sent Events from before it starts; the Celery worker's and the web process's memory
  (RSS) sampled all along, and while the stored log is replayed (SSE from the start) and downloaded;
- the floor: the same program, by hand in the same kind of containers (the runtime's own `podman run`
  argv, started over SSH) on the same nodes, with the plan's own mpirun command and `> /dev/null`;
- a job printing 4 lines every 0.1 s: the live follower's delay from print to receipt when nothing else runs;
- the console's part alone: a file of tagged lines sent over SSH and read as the launch reads mpirun's
  output files (decoded, split, stored), with no program or mpirun competing.

    .venv/bin/python bench/log_throughput.py [--lines-per-rank 500000] [--idle-followers 20]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import re
import shlex
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import benchkit

VAR = benchkit.environment("logs", subnet="10.88.0.0/24", bridge="tclogbr", prefix="tclog")
os.environ["LOG_LEVEL"] = "WARNING"

FLOOD = '''
import sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
count = int(sys.argv[1].split("=", 1)[1])
pad = "x" * 48
now = time.time
comm.Barrier()
started = now()
for number in range(count):
    print(f"FLOOD {rank} {number:07d} {now():.6f} {pad}")
sys.stdout.flush()
comm.Barrier()
if rank == 0:
    print(f"FLOOD-ELAPSED {now() - started:.6f}", file=sys.stderr, flush=True)
'''
TICKS = '''
import time
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
for number in range(50):
    print(f"TICK {rank} {number} {time.time():.6f}", flush=True)
    time.sleep(0.1)
'''
PRINTED = re.compile(rb'"text": "(?:FLOOD \d+ \d+|TICK \d+ \d+) ([0-9.]+)')
STORED = re.compile(rb'"at": "([^"]+)"')
ELAPSED = re.compile(r"FLOOD-ELAPSED ([0-9.]+)")
SAMPLE_EVERY = 50  # lines whose delays the follower works out: all of them would cost this process more than it reads


class Memory(threading.Thread):
    """The Celery worker's and the web process's RSS every 0.2 s, each sample under the phase it was taken in."""

    def __init__(self, pids: dict[str, int]):
        super().__init__(daemon=True)
        self.pids, self.phase, self.samples = pids, "idle", []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            self.samples.append((self.phase, {name: benchkit.rss_kib(pid) for name, pid in self.pids.items()}))

    def peak(self, name: str, phase: str) -> float:
        return max((sample[name] for at, sample in self.samples if at == phase), default=0) / 1024

    def first(self, name: str, phase: str) -> float:
        return next((sample[name] for at, sample in self.samples if at == phase), 0) / 1024


class EventCounter(threading.Thread):
    """A lean SSE client: counts line events, notes when the first and last came and when the stream ended,
    and for one line in SAMPLE_EVERY the delay from its print (the time in its text) and from its `at`."""

    def __init__(self, port: int, path: str, token: str, stop_at_end: bool = True, sample_every: int = SAMPLE_EVERY):
        super().__init__(daemon=True)
        self.port, self.path, self.token, self.stop_at_end = port, path, token, stop_at_end
        self.sample_every = sample_every
        self.lines = 0
        self.first = self.last = self.last_wall = self.ended = None
        self.flood_first = self.flood_last = None
        self.from_print, self.from_stored = [], []
        self.connected = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        connection.request("GET", self.path, headers={"Authorization": f"Token {self.token}",
                                                      "Accept": "text/event-stream"})
        response = connection.getresponse()
        self.connected.set()
        tail = b""
        while not self.stop.is_set():
            data = response.read1(1 << 16)
            if not data:
                break
            blocks = (tail + data).split(b"\n\n")
            tail = blocks.pop()
            now, wall = time.monotonic(), time.time()
            for block in blocks:
                if block.startswith(b"id: ") and b"\nevent: " not in block:
                    self.lines += 1
                    self.first = self.first or now
                    self.last, self.last_wall = now, wall
                    if b'"text": "FLOOD ' in block:
                        self.flood_first = self.flood_first or now
                        self.flood_last = now
                    if self.lines % self.sample_every == 0:
                        printed, stored = PRINTED.search(block), STORED.search(block)
                        if printed:
                            self.from_print.append(wall - float(printed.group(1)))
                        if stored:
                            self.from_stored.append(wall - datetime.fromisoformat(stored.group(1).decode()).timestamp())
                elif block.startswith(b"event: end"):
                    self.ended = now
            if self.ended and self.stop_at_end:
                break
        connection.close()


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))] if ordered else float("nan")


def submit(owner, name: str, code: str, boot: str, parameters: list[dict] | None = None):
    from jobs.submission.forms import TrainingJobForm
    from jobs.submission.jobs import submit_job

    form = TrainingJobForm(data={"name": name, "engine": "MPI", "code_dir": code, "boot_file": boot,
                                 "spec": "local-cpu-2", "node_count": 2, "parameters": parameters or []})
    assert form.is_valid(), form.errors
    return submit_job(form, owner)


async def raw_run(owner, nodes, lines_per_rank: int) -> dict:
    """The floor: the flood by hand in the runtime's containers, mpirun's output to /dev/null (stderr kept)."""
    from jobs.runtime.preparation import write_code_archive
    from jobs.runtime.ssh import connect

    plan = await asyncio.to_thread(benchkit.bare_plan, owner, nodes, {
        "name": "raw-flood", "engine": "MPI", "code_dir": "flood", "boot_file": "flood.py", "spec": "local-cpu-2",
        "node_count": 2, "parameters": [{"name": "count", "value": str(lines_per_rank)}]})
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "code.tar"
        write_code_archive(plan, archive)
        await asyncio.gather(*(benchkit.prepare_by_hand(plan, worker, archive, Path(scratch))
                               for worker in plan.workers))
    try:
        command = f"cd {shlex.quote(plan.working_dir)} && {shlex.join(plan.argv)} > /dev/null"
        async with await connect(plan.container_target(plan.workers[0])) as connection:
            started = time.monotonic()
            result = await connection.run(command, check=False)
            wall = time.monotonic() - started
        elapsed = ELAPSED.search(str(result.stderr))
        assert result.exit_status == 0 and elapsed, (result.exit_status, str(result.stderr)[-500:])
        return {"elapsed": float(elapsed.group(1)), "wall": wall}
    finally:
        await asyncio.gather(*(benchkit.remove_by_hand(plan, worker) for worker in plan.workers))


async def console_part_alone(node, job_id: int, lines: int) -> float:
    """A node sends a file of tagged lines over SSH; it is read as the launch reads mpirun's files, and stored."""
    from types import SimpleNamespace

    from jobs.logs.sink import LogSink
    from jobs.runtime.launcher import Follow
    from jobs.runtime.ssh import connect
    from jobs.runtime.ssh_output import BoundedOutput

    line = "[1,{rank}]<stdout>:FLOOD {rank} {number:07d} 1764590000.000000 " + "x" * 48
    script = f"import sys\nw = sys.stdout.write\nfor n in range({lines:d}): w({line!r}.format(rank=n % 4, number=n) + '\\n')"
    async with await connect(node.ssh_target()) as connection:
        await connection.run(f"python3 -c {shlex.quote(script)} > log-throughput-bench.txt", check=True)
        started = time.monotonic()
        _channel, output = await connection.create_session(BoundedOutput, "cat log-throughput-bench.txt",
                                                           encoding=None)
        async with LogSink(job_id) as sink:
            # Only the reading is timed here: the plan needs its rank placement, and a worker for the run folder
            # it would start mpirun in (never used: nothing is started).
            plan = SimpleNamespace(rank_workers=(0, 0, 1, 1), job_id=job_id, workers=[SimpleNamespace(workdir="")])
            follow = Follow(plan, sink, None, asyncio.Event())
            await follow.pump(output)
            await follow.finish()
        seconds = time.monotonic() - started
        await connection.run("rm -f log-throughput-bench.txt")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines-per-rank", type=int, default=500_000)
    parser.add_argument("--idle-followers", type=int, default=20)
    args = benchkit.begin("log_throughput", parser, 590)

    with benchkit.Console(VAR, nodes=2, slots=2, web=True) as console:
        from django.contrib.auth import get_user_model
        from django.db.models import Sum
        from django.db.models.functions import Length

        from console import services
        from jobs.code_dirs.service import register
        from jobs.images.recipes import MPI
        from jobs.models import FINAL_STATES, ApiToken, LogLine, Node, TrainingJob
        from jobs.runtime.node_images import console_archive

        for name, boot, text in (("flood", "flood.py", FLOOD), ("ticks", "ticks.py", TICKS)):
            code = VAR / "code" / name
            code.mkdir(parents=True, exist_ok=True)
            (code / boot).write_text(text)
            register(name, code, sharing="everyone")
        owner = get_user_model().objects.get(username="admin")
        token = ApiToken.issue(owner, "bench")[1]
        nodes = list(Node.objects.order_by("name"))
        archive = console_archive(MPI.reference)
        assert archive is not None, f"no archive of {MPI.reference}: run manage.py buildimages"
        asyncio.run(benchkit.load_image_on_nodes(nodes, MPI.reference, archive))
        port, worker, web = console.web_port, console.worker, console.web
        time.sleep(3)  # the worker settles (imports, broker connection) before its memory is read
        memory = Memory({"worker": worker.pid, "web": web.pid})
        memory.start()
        time.sleep(0.5)
        expected = 4 * args.lines_per_rank

        raw_before = asyncio.run(raw_run(owner, nodes, args.lines_per_rank))
        worker_cpu, web_cpu = benchkit.cpu_seconds(worker.pid), benchkit.cpu_seconds(web.pid)
        memory.phase = "flood"
        job = submit(owner, "flood", "flood", "flood.py", [{"name": "count", "value": str(args.lines_per_rank)}])
        submitted = time.monotonic()
        live = EventCounter(port, f"/api/v1/training-jobs/{job.pk}/log/events", token)
        live.start()
        live.connected.wait(10)
        while TrainingJob.objects.values_list("status", flat=True).get(pk=job.pk) not in FINAL_STATES:
            time.sleep(0.2)
        job_seconds = time.monotonic() - submitted
        worker_cpu, web_cpu = benchkit.cpu_seconds(worker.pid) - worker_cpu, benchkit.cpu_seconds(web.pid) - web_cpu
        live.join(300)
        memory.phase = "after"
        job.refresh_from_db()
        floods = LogLine.objects.filter(job=job, text__startswith="FLOOD ")
        flood_lines = floods.count()
        first_stored, last_stored = floods.order_by("seq").first().at, floods.order_by("-seq").first().at
        store_seconds = max((last_stored - first_stored).total_seconds(), 1e-9)
        elapsed_line = LogLine.objects.filter(job=job, text__startswith="FLOOD-ELAPSED").first()
        ranks_seconds = float(ELAPSED.search(elapsed_line.text).group(1)) if elapsed_line else float("nan")
        text_bytes = floods.aggregate(size=Sum(Length("text")))["size"] + flood_lines  # ASCII: characters are bytes
        time.sleep(1)

        memory.phase = "replay"
        replay = EventCounter(port, f"/api/v1/training-jobs/{job.pk}/log/events", token, sample_every=10 ** 9)
        replay_start = time.monotonic()
        replay.start()
        replay.join(300)
        replay_seconds = replay.ended - replay_start

        memory.phase = "download"
        download_start = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        connection.request("GET", f"/api/v1/training-jobs/{job.pk}/log/download",
                           headers={"Authorization": f"Token {token}"})
        response = connection.getresponse()
        downloaded = downloaded_lines = 0
        while chunk := response.read1(1 << 16):
            downloaded += len(chunk)
            downloaded_lines += chunk.count(b"\n")
        download_seconds = time.monotonic() - download_start
        memory.phase = "settled"
        time.sleep(2)

        memory.phase = "ticks"
        ticks_job = submit(owner, "ticks", "ticks", "ticks.py")
        ticking = EventCounter(port, f"/api/v1/training-jobs/{ticks_job.pk}/log/events", token, sample_every=1)
        ticking.start()
        ticking.join(180)
        memory.done.set()

        threads_before = benchkit.thread_count(web.pid)
        idle = [EventCounter(port, f"/api/v1/training-jobs/{job.pk}/log/events?after={job.log_line_count}",
                             token, stop_at_end=False) for _ in range(args.idle_followers)]
        running = TrainingJob.objects.filter(pk=job.pk)
        running.update(status="Running")  # so the idle followers wait for news instead of ending
        for follower in idle:
            follower.start()
            follower.connected.wait(10)
        time.sleep(1)
        threads_with_followers = benchkit.thread_count(web.pid)
        for follower in idle:
            follower.stop.set()
        running.update(status=job.status)

        raw_after = asyncio.run(raw_run(owner, nodes, args.lines_per_rank))

        alone_lines = min(expected, 500_000)
        services.stop(worker)  # the console's part alone runs in this process: nothing else should compete
        console.worker = None
        bare = TrainingJob.objects.create(
            name="alone", owner=owner, engine_version=job.engine_version, code_dir=job.code_dir, boot_file="flood.py",
            spec=job.spec, node_count=1, bind_args="", x_args="", mca_args="", tune_prefixes="MA_", status="Running")
        alone_seconds = asyncio.run(console_part_alone(nodes[0], bare.pk, alone_lines))
        alone_stored = LogLine.objects.filter(job=bare).count()

        # The floor is the better of the two by-hand runs, one before the console's job and one after it.
        raw = min(raw_before, raw_after, key=lambda run: run["elapsed"])
        raw_rate = expected / raw["elapsed"]
        stored_rate = expected / store_seconds
        follower_rate = flood_lines / max(live.flood_last - live.flood_first, 1e-9)
        print(f"\nflood job: 2 nodes x 2 ranks, {expected:,} lines printed ({text_bytes / 1e6:.0f} MB of text), "
              f"{flood_lines:,} stored ({'all' if flood_lines == expected else 'NOT all'}), ended {job.status}, "
              f"{job_seconds:.0f} s from submission; {benchkit.load_line()} at the end")
        rows = [
            ["ranks -> mpirun (floor: by hand, same containers, `mpirun ... > /dev/null`)", f"{raw_rate:,.0f}", "1.00",
             f"{expected:,} lines in {raw['elapsed']:.1f} s between the program's barriers (mpirun {raw['wall']:.1f} s); "
             f"before the job {expected / raw_before['elapsed']:,.0f}, after it {expected / raw_after['elapsed']:,.0f}"],
            ["ranks -> mpirun's files, in the console's job (the program's own clock)",
             f"{expected / ranks_seconds:,.0f}", f"{expected / ranks_seconds / raw_rate:.2f}",
             f"in {ranks_seconds:.1f} s"],
            ["-> stored (first to last program line's `at`)", f"{stored_rate:,.0f}", f"{stored_rate / raw_rate:.2f}",
             f"{text_bytes / store_seconds / 1e6:.1f} MB/s over {store_seconds:.1f} s"],
            ["-> live SSE follower (connected before the start; first to last program line)", f"{follower_rate:,.0f}",
             f"{follower_rate / raw_rate:.2f}", f"{live.lines:,} lines received, the last (the job's end) "
             f"{live.last_wall - last_stored.timestamp():.2f} s after the last program line's `at`"],
            ["console's part alone: SSH -> read as the launch reads -> stored", f"{alone_stored / alone_seconds:,.0f}",
             f"{alone_stored / alone_seconds / raw_rate:.2f}", f"{alone_stored:,} lines in {alone_seconds:.1f} s, "
             "no program or mpirun competing"],
            ["stored -> replay from the start (SSE)", f"{replay.lines / replay_seconds:,.0f}",
             f"{replay.lines / replay_seconds / raw_rate:.2f}", f"{replay.lines:,} lines in {replay_seconds:.1f} s"],
            ["stored -> download", f"{downloaded_lines / download_seconds:,.0f}",
             f"{downloaded_lines / download_seconds / raw_rate:.2f}",
             f"{downloaded / download_seconds / 1e6:.1f} MB/s, {downloaded_lines:,} lines"],
        ]
        print(benchkit.table(["flow", "lines/s", "of the floor", "how"], rows))

        def delays(values: list[float]) -> str:
            return (f"p50 {statistics.median(values):.2f} s, p99 {percentile(values, 0.99):.2f} s, "
                    f"max {max(values):.2f} s ({len(values)} lines)") if values else "-"

        print("live follower's delay (its clock on receipt minus the line's time):")
        print(benchkit.table(["while", "from the rank's print", "from `at` (the console read it, then stored it)"], [
            [f"the flood (one line in {SAMPLE_EVERY})", delays(live.from_print), delays(live.from_stored)],
            ["4 lines every 0.1 s", delays(ticking.from_print), delays(ticking.from_stored)]]))
        print(benchkit.table(["process", "before", "peak while the flood streamed", "after", "peak in the replay",
                              "peak in the download", "settled"], [
            [name, f"{memory.first(key, 'idle'):.0f}", f"{memory.peak(key, 'flood'):.0f}",
             f"{memory.first(key, 'after'):.0f}", f"{memory.peak(key, 'replay'):.0f}",
             f"{memory.peak(key, 'download'):.0f}", f"{memory.first(key, 'settled'):.0f}"]
            for name, key in (("Celery worker RSS MiB", "worker"), ("web process (uvicorn) RSS MiB", "web"))]))
        print(f"CPU while the flood job ran: Celery worker {worker_cpu:.1f} s, web process {web_cpu:.1f} s over "
              f"{job_seconds:.0f} s ({os.cpu_count()} cores shared with the ranks, mpirun and sshd)")
        print(f"web process threads: {threads_before} with no follower, {threads_with_followers} with "
              f"{args.idle_followers} idle followers")


if __name__ == "__main__":
    main()
