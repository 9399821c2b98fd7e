"""How fast one job's output flows from mpirun into storage and out to a following client, and what it costs in memory.

Brings up everything it measures (its own database, Redis, Celery worker, web server under uvicorn and a
local cluster on its own bridge and subnet), runs one 2-node job whose 4 ranks print as fast as they can,
follows its log live over Server-Sent Events meanwhile, then reads the stored log back (events from the
start, and the download), prints the numbers, and takes it all down again.

    .venv/bin/python bench/log_throughput.py [--lines-per-rank 60000] [--idle-followers 20]
"""

import argparse
import asyncio
import http.client
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
BENCH_VAR = BASE_DIR / "var" / "bench-logs"
sys.path.insert(0, str(BASE_DIR))
os.environ.update(
    DJANGO_SETTINGS_MODULE="console.settings",
    CONSOLE_VAR_DIR=str(BENCH_VAR),
    NODE_WORK_ROOT="/var/lib/training-console/bench-log-jobs",
    LOCALCLUSTER_SUBNET="10.81.0.0/24",
    LOCALCLUSTER_BRIDGE="tclogbr",
    LOCALCLUSTER_PREFIX="tclog",
    LOCALCLUSTER_STATE_DIR="/var/lib/training-console/bench-logs-cluster",
    LOG_LEVEL="WARNING",
)

FLOOD = '''
import sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
count = int(sys.argv[1].split("=", 1)[1])
pad = "x" * 60
comm.Barrier()
for number in range(count):
    print(f"FLOOD {rank} {number:07d} {pad}")
comm.Barrier()
'''
TICKS = '''
import sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
for number in range(20):
    print(f"TICK {rank} {number} {time.time():.6f}")
    time.sleep(0.25)
'''
TICK_TIME = re.compile(rb"TICK \d+ \d+ ([0-9.]+)")


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def pump_file_from_node(node, job_id: int, lines: int) -> float:
    """The console's own part alone: a node prints a file of tagged lines over SSH; it is read, parsed and stored."""
    from types import SimpleNamespace

    from jobs.logs.sink import LogSink
    from jobs.runtime.launcher import _pump
    from jobs.runtime.ssh import connect
    from jobs.runtime.ssh_output import BoundedOutput

    line = "[1,{rank}]<stdout>:FLOOD {rank} {number:07d} " + "x" * 60
    script = f"import sys\nw = sys.stdout.write\nfor n in range({lines:d}): w({line!r}.format(rank=n % 4, number=n) + '\\n')"
    async with await connect(node.ssh_target()) as connection:
        await connection.run(f"python3 -c {shlex.quote(script)} > /tmp/log-throughput-bench.txt", check=True)
        started = time.monotonic()
        _channel, output = await connection.create_session(BoundedOutput, "cat /tmp/log-throughput-bench.txt",
                                                           encoding="utf-8", errors="replace")
        async with LogSink(job_id) as sink:
            await _pump(output, SimpleNamespace(rank_workers=(0, 0, 1, 1)), sink)
        seconds = time.monotonic() - started
        await connection.run("rm -f /tmp/log-throughput-bench.txt")
    return seconds


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


class EventCounter(threading.Thread):
    """A lean SSE client: counts line events and notes when the first and last arrived and when the stream ended."""

    def __init__(self, port: int, path: str, token: str, stop_at_end: bool = True):
        super().__init__(daemon=True)
        self.port, self.path, self.token, self.stop_at_end = port, path, token, stop_at_end
        self.lines = 0
        self.first = self.last = self.ended = None
        self.latencies = []  # seconds from a TICK line's print to its arrival here
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
            now = time.monotonic()
            for block in blocks:
                if block.startswith(b"id: ") and b"\nevent: " not in block:
                    tick = TICK_TIME.search(block)
                    if tick:
                        self.latencies.append(time.time() - float(tick.group(1)))
                    self.lines += 1
                    self.first = self.first or now
                    self.last = now
                elif block.startswith(b"event: end"):
                    self.ended = now
            if self.ended and self.stop_at_end:
                break
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines-per-rank", type=int, default=60000)
    parser.add_argument("--idle-followers", type=int, default=20)
    args = parser.parse_args()

    from console import services

    redis_port, web_port = services.free_port(), services.free_port()
    os.environ["REDIS_URL"] = os.environ["CELERY_BROKER_URL"] = f"redis://127.0.0.1:{redis_port}/0"
    BENCH_VAR.mkdir(parents=True, exist_ok=True)
    for stale in BENCH_VAR.glob("console.sqlite3*"):
        stale.unlink()

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from jobs.code_dirs import register
    from jobs.forms import TrainingJobForm
    from jobs.models import FINAL_STATES, ApiToken, LogLine, TrainingJob
    from jobs.submission import submit_job

    quiet = open(os.devnull, "w")
    redis = services.start_redis(redis_port, BENCH_VAR / "redis.log")
    worker = web = None
    try:
        call_command("migrate", verbosity=0)
        call_command("seedconsole", password="bench", stdout=quiet)
        call_command("localcluster", "up", nodes=2, slots=2, stdout=quiet)
        code = BENCH_VAR / "code" / "flood"
        code.mkdir(parents=True, exist_ok=True)
        (code / "flood.py").write_text(FLOOD)
        register("flood", code, sharing="everyone")
        ticks_code = BENCH_VAR / "code" / "ticks"
        ticks_code.mkdir(parents=True, exist_ok=True)
        (ticks_code / "ticks.py").write_text(TICKS)
        register("ticks", ticks_code, sharing="everyone")
        owner = get_user_model().objects.get(username="admin")
        token = ApiToken.issue(owner, "bench")[1]

        worker = services.start_celery_worker({}, BENCH_VAR / "celery-worker.log")
        web = subprocess.Popen([sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                                "--port", str(web_port), "--log-level", "warning"], cwd=BASE_DIR,
                               stdout=open(BENCH_VAR / "uvicorn.log", "ab"), stderr=subprocess.STDOUT)
        services.wait_for_port("127.0.0.1", web_port, 30, web)
        time.sleep(3)  # the worker settles (imports, broker connection) before its memory is read

        form = TrainingJobForm(data={"name": "flood", "engine": "MPI", "code_dir": "flood", "boot_file": "flood.py",
                                     "spec": "local-cpu-2", "node_count": 2,
                                     "parameters": [{"name": "count", "value": str(args.lines_per_rank)}]})
        assert form.is_valid(), form.errors
        worker_rss_before, web_rss_before = rss_kib(worker.pid), rss_kib(web.pid)
        worker_cpu_before, web_cpu_before = cpu_seconds(worker.pid), cpu_seconds(web.pid)
        job = submit_job(form, owner)
        live = EventCounter(web_port, f"/api/v1/training-jobs/{job.pk}/log/events", token)
        live.start()
        live.connected.wait(10)

        samples = []  # (time, stored lines, worker RSS)
        while True:
            status, count = TrainingJob.objects.values_list("status", "log_line_count").get(pk=job.pk)
            samples.append((time.monotonic(), count, rss_kib(worker.pid)))
            if status in FINAL_STATES:
                break
            time.sleep(0.05)
        worker_peak = max(rss for _t, _c, rss in samples)
        worker_cpu, web_cpu = cpu_seconds(worker.pid) - worker_cpu_before, cpu_seconds(web.pid) - web_cpu_before
        job.refresh_from_db()
        live.join(120)
        flood_lines = LogLine.objects.filter(job=job, text__startswith="FLOOD ").count()
        expected = 4 * args.lines_per_rank
        first_flood = LogLine.objects.filter(job=job, text__startswith="FLOOD ").order_by("seq").first().seq
        last_flood = LogLine.objects.filter(job=job, text__startswith="FLOOD ").order_by("-seq").first().seq
        started = next(t for t, count, _rss in samples if count >= first_flood)
        stored_all = next(t for t, count, _rss in samples if count >= last_flood)
        store_seconds = max(stored_all - started, 1e-9)
        text_bytes = sum(len(text) + 1 for text in LogLine.objects.filter(job=job).values_list("text", flat=True).iterator())

        replay = EventCounter(web_port, f"/api/v1/training-jobs/{job.pk}/log/events", token)
        replay_start = time.monotonic()
        replay.start()
        replay.join(300)
        replay_seconds = replay.ended - replay_start

        download_start = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", web_port, timeout=300)
        connection.request("GET", f"/api/v1/training-jobs/{job.pk}/log/download", headers={"Authorization": f"Token {token}"})
        response = connection.getresponse()
        downloaded = downloaded_lines = 0
        while chunk := response.read1(1 << 16):
            downloaded += len(chunk)
            downloaded_lines += chunk.count(b"\n")
        download_seconds = time.monotonic() - download_start
        web_rss_after = rss_kib(web.pid)

        threads_before = thread_count(web.pid)
        idle = [EventCounter(web_port, f"/api/v1/training-jobs/{job.pk}/log/events?after={job.log_line_count}",
                             token, stop_at_end=False) for _ in range(args.idle_followers)]
        running = TrainingJob.objects.filter(pk=job.pk)
        running.update(status="Running")  # so the idle followers wait for news instead of ending
        for follower in idle:
            follower.start()
            follower.connected.wait(10)
        time.sleep(1)
        threads_with_followers = thread_count(web.pid)
        for follower in idle:
            follower.stop.set()
        running.update(status=job.status)

        from jobs.models import Node

        worker_rss_after = rss_kib(worker.pid)
        ticks_form = TrainingJobForm(data={"name": "ticks", "engine": "MPI", "code_dir": "ticks",
                                           "boot_file": "ticks.py", "spec": "local-cpu-2", "node_count": 2})
        assert ticks_form.is_valid(), ticks_form.errors
        ticks_job = submit_job(ticks_form, owner)
        ticking = EventCounter(web_port, f"/api/v1/training-jobs/{ticks_job.pk}/log/events", token)
        ticking.start()
        ticking.join(180)
        latencies = sorted(ticking.latencies)

        services.stop(worker)  # the console-side measurement runs here; nothing else should compete
        worker = None
        bare = TrainingJob.objects.create(
            name="bare", owner=owner, engine_version=job.engine_version, code_dir=job.code_dir, boot_file="flood.py",
            spec=job.spec, node_count=1, bind_args="", x_args="", mca_args="", tune_prefixes="MA_", status="Running")
        bare_rss = [rss_kib(os.getpid())]
        sampling = threading.Event()

        def sample_own_rss():
            while not sampling.wait(0.1):
                bare_rss.append(rss_kib(os.getpid()))

        sampler = threading.Thread(target=sample_own_rss, daemon=True)
        sampler.start()
        bare_seconds = asyncio.run(pump_file_from_node(Node.objects.order_by("name").first(), bare.pk, expected))
        sampling.set()
        sampler.join()
        bare_stored = LogLine.objects.filter(job=bare).count()

        mib = 1024.0
        print(f"job: 2 nodes x 2 ranks, {expected} lines printed ({text_bytes / 1e6:.1f} MB stored text), "
              f"{job.log_line_count} lines stored in all, ended {job.status}")
        print(f"  complete: {flood_lines == expected} ({flood_lines} of {expected} program lines stored)")
        print(f"mpirun -> storage: {expected / store_seconds:,.0f} lines/s ({text_bytes / store_seconds / 1e6:.1f} MB/s) "
              f"over {store_seconds:.1f} s from the first program line stored to the last")
        print(f"  the console's part alone (SSH channel -> lines -> stored, no program or mpirun competing): "
              f"{bare_stored / bare_seconds:,.0f} lines/s ({bare_stored} lines in {bare_seconds:.1f} s); "
              f"RSS {bare_rss[0] / 1024:.0f} MiB before, {max(bare_rss) / 1024:.0f} MiB peak")
        print(f"storage -> live follower (SSE, connected before the job started): {live.lines} lines received, "
              f"{live.lines / max(live.last - live.first, 1e-9):,.0f} lines/s; last line reached it "
              f"{max(live.last - stored_all, 0):.2f} s after it was stored")
        print(f"print -> live follower latency, a job printing 4 lines every 0.25 s: median "
              f"{latencies[len(latencies) // 2]:.2f} s, max {latencies[-1]:.2f} s over {len(latencies)} lines")
        print(f"stored -> client, replay from the start (SSE): {replay.lines / replay_seconds:,.0f} lines/s "
              f"({replay.lines} lines in {replay_seconds:.1f} s)")
        print(f"stored -> client, download: {downloaded / download_seconds / 1e6:.1f} MB/s, "
              f"{downloaded_lines / download_seconds:,.0f} lines/s ({downloaded_lines} lines)")
        print(f"CPU while the job ran: Celery worker {worker_cpu:.1f} s, web process {web_cpu:.1f} s "
              f"(the job took {samples[-1][0] - samples[0][0]:.1f} s from submission; this machine has {os.cpu_count()} cores)")
        print(f"Celery worker RSS: {worker_rss_before / mib:.0f} MiB before, {worker_peak / mib:.0f} MiB peak while "
              f"storing, {worker_rss_after / mib:.0f} MiB after")
        print(f"web process RSS: {web_rss_before / mib:.0f} MiB before, {web_rss_after / mib:.0f} MiB after "
              "following, replaying and downloading the whole log")
        print(f"web process threads: {threads_before} with no follower, {threads_with_followers} with "
              f"{args.idle_followers} idle followers (Django's middleware keeps one idle thread per open request)")
    finally:
        services.stop(web)
        services.stop(worker)
        call_command("localcluster", "down", stdout=open(os.devnull, "w"))
        services.stop(redis)


if __name__ == "__main__":
    main()
