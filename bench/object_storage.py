"""A job's object-store data on this machine, each figure beside its floor measured in the same run:

- stage-in: a 2-node job whose data_url holds 1,000 objects of 1 MiB (1,000 MiB; generated at random and put in
  the store with boto3 first, not timed), from its submission to "input ready" on both workers, and the
  staging step itself (each worker's "input: fetching" line to its "input ready" line, LogLine.at); then a
  second job with the same data_url (the node's cache: 0 bytes fetched). Floors: the same 1,000 objects
  fetched by hand from both nodes at once, as root over SSH, with the presigned URLs the console would hand
  out (a Python loop with urllib, one object after another, as stage-inputs.py fetches; and curl with 8
  transfers at a time, for what parallel fetching gets); for the cache hit, the same 1,000 files
  hard-linked by hand (`cp -al`) on both nodes at once.
- output: the first job's program writes a 1 GiB checkpoint into --train_url and ends; the console's last
  upload (jobs.runtime.data_out.OutputSync, from worker-0's container) is timed from its "Uploading the
  outputs" line to its "Uploaded" line. Floor: a 1 GiB file uploaded by hand from the same node with one
  presigned PUT (Python urllib, as outputs-upload.py does; and curl -T).

Brings up everything it measures: its own database, Redis, Celery worker, a local cluster of 2 nodes on
bridge tcbobr0 (10.91.0.0/24; 10.86 is launch_overhead.py's) and its own SeaweedFS (jobs.localstore, S3
gateway on 10.91.0.1:19700, its master, volume and filer on the next three ports). The 2 "nodes" share
this machine's disk and cores, and the store runs on the same cores: on real hosts each has its own.
They also share NODE_WORK_ROOT; so that each node has a cache of its own (NODE_WORK_ROOT/.object-cache),
as a host with its own disk has, each node's NODE_WORK_ROOT is a bind mount (in the node's own mount
namespace) of a folder of its own. (With one cache for both, the two stage-ins race on the same cache
entries: a node's os.link of an entry the other node has just replaced fails with ENOENT, and the job
fails; see docs/benchmarks.md.) With less than 8 GiB free on / the sizes are halved (500 objects, a
512 MiB checkpoint), and it says so.

    .venv/bin/python bench/object_storage.py [--objects 1000] [--megabytes 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shlex
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import benchkit

VAR = benchkit.environment("objstore", subnet="10.91.0.0/24", bridge="tcbobr0", prefix="tcbon")
STORE_PORT = 19700
STORE_STATE = Path("/tmp/bench-objstore-store")
STORE_PID = VAR / "seaweedfs.pid"
OBJECT_BYTES = 1 << 20
JOB_TIMEOUT = 300
# The job's program: rank 0 writes one checkpoint of --size_mb MiB into --train_url (random bytes: nothing
# along the way can compress them), synced to disk before the program ends.
PROGRAM = """\
import argparse, os, time
parser = argparse.ArgumentParser()
parser.add_argument("--data_url", default="")
parser.add_argument("--train_url", default="")
parser.add_argument("--size_mb", type=int, default=0)
args, _ = parser.parse_known_args()
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
if args.data_url:
    count = sum(len(names) for _, _, names in os.walk(args.data_url))
    print(f"rank {rank} sees {count} input files", flush=True)
if rank == 0 and args.train_url and args.size_mb:
    os.makedirs(args.train_url, exist_ok=True)
    started = time.monotonic()
    block = os.urandom(64 << 20)
    with open(os.path.join(args.train_url, "checkpoint.bin"), "wb") as out:
        for _ in range(args.size_mb // 64):
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    print(f"checkpoint written in {time.monotonic() - started:.1f} s", flush=True)
"""
# The floor of a stage-in, on a node as root: the same objects, one after another, with urllib.
FETCH = """\
import json, os, shutil, sys, time, urllib.request
folder, urls = sys.argv[1], json.load(sys.stdin)
os.makedirs(folder, exist_ok=True)
started, total = time.monotonic(), 0
for number, url in enumerate(urls):
    with urllib.request.urlopen(url, timeout=60) as answer, open(os.path.join(folder, str(number)), "wb") as out:
        shutil.copyfileobj(answer, out, 1 << 20)
        total += out.tell()
print(total, round(time.monotonic() - started, 3))
"""
# The floor of an output upload, on a node as root: one presigned PUT, as outputs-upload.py sends it.
PUT = """\
import os, sys, time, urllib.request
path, url = sys.argv[1], sys.argv[2]
started = time.monotonic()
with open(path, "rb") as source:
    size = os.fstat(source.fileno()).st_size
    request = urllib.request.Request(url, data=source, method="PUT", headers={"Content-Length": str(size)})
    with urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()
print(size, round(time.monotonic() - started, 3))
"""


def mib(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB"


def stop_stale_store() -> None:
    """The SeaweedFS a killed run of this benchmark left (by the pid it wrote, if it is still that program)."""
    try:
        pid = int(STORE_PID.read_text())
        if f"-s3.port={STORE_PORT}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass
    STORE_PID.unlink(missing_ok=True)
    shutil.rmtree(STORE_STATE, ignore_errors=True)


def fill_bucket(store, bucket: str, prefix: str, count: int) -> None:
    def put(number: int) -> None:
        store.client.put_object(Bucket=bucket, Key=f"{prefix}part-{number:05d}.bin", Body=os.urandom(OBJECT_BYTES))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(count)))


async def on_nodes(nodes, commands: list[str], inputs: list[str] | None = None) -> tuple[float, list[str]]:
    """Each node runs its command as root over SSH, all at once (connected first); the wall time of them
    all, and what each printed."""
    from jobs.runtime.ssh import connect

    connections = [await connect(node.ssh_target()) for node in nodes]
    try:
        started = time.monotonic()
        results = await asyncio.gather(*(connection.run(command, input=(inputs or [None] * len(nodes))[index],
                                                        check=True, timeout=600)
                                         for index, (connection, command) in enumerate(zip(connections, commands, strict=True))))
        seconds = time.monotonic() - started
    finally:
        for connection in connections:
            connection.close()
    return seconds, [str(result.stdout).strip() for result in results]


def submit(owner, name: str, data_url: str, train_url: str, size_mb: int):
    from jobs.submission.forms import TrainingJobForm
    from jobs.submission.jobs import submit_job

    data = {"name": name, "engine": "MPI", "code_dir": "objstore", "boot_file": "objstore.py", "spec": "local-cpu-2",
            "node_count": 2, "data_url": data_url, "parameters": [{"name": "size_mb", "value": str(size_mb)}]}
    if train_url:
        data["train_url"] = train_url
    form = TrainingJobForm(data=data, user=owner)
    assert form.is_valid(), form.errors
    return submit_job(form, owner)


def run_job(owner, name: str, data_url: str, train_url: str, size_mb: int) -> dict:
    """The job to its end: when it was submitted, its platform lines (time, worker, text) and its rank lines."""
    from django.utils import timezone

    from jobs.models import FINAL_STATES, JobStatus, LogLine, LogStream, TrainingJob

    submitted = timezone.now()
    job = submit(owner, name, data_url, train_url, size_mb)
    deadline = time.monotonic() + JOB_TIMEOUT
    while (status := TrainingJob.objects.values_list("status", flat=True).get(pk=job.pk)) not in FINAL_STATES:
        assert time.monotonic() < deadline, f"{name} still {status} after {JOB_TIMEOUT} s"
        time.sleep(0.1)
    lines = list(LogLine.objects.filter(job=job).order_by("seq").values_list("at", "worker_index", "stream", "text"))
    text = "\n".join(f"{worker}|{line}" for _, worker, _, line in lines)
    assert status == JobStatus.COMPLETED, f"{name} ended {status}:\n{text[-3000:]}"
    return {"id": job.pk, "submitted": submitted, "text": text,
            "system": [(at, worker, line) for at, worker, stream, line in lines if stream == LogStream.SYSTEM]}


def staging(run: dict) -> dict:
    """From a job's platform lines: submission -> input ready on both workers, each worker's staging step
    (its "input: fetching" line to its "input ready" line) and its "input ready" line."""
    fetching = {worker: at for at, worker, line in run["system"] if line.startswith("input: fetching")}
    ready = {worker: (at, line) for at, worker, line in run["system"] if line.startswith("input ready:")}
    assert sorted(ready) == [0, 1], run["text"][-3000:]
    last: datetime = max(at for at, _ in ready.values())
    return {"to_ready": (last - run["submitted"]).total_seconds(),
            "step": (last - min(fetching.values())).total_seconds(),
            "each": {worker: (ready[worker][0] - fetching[worker]).total_seconds() for worker in ready},
            "lines": {worker: line for worker, (_, line) in sorted(ready.items())}}


def upload(run: dict) -> tuple[float, str]:
    started = next(at for at, _, line in run["system"] if line.startswith("Uploading the outputs to"))
    at, line = next((at, line) for at, _, line in run["system"] if line.startswith(("Uploaded ", "The outputs could")))
    return (at - started).total_seconds(), line


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=1000, help="input objects of 1 MiB each")
    parser.add_argument("--megabytes", type=int, default=1024, help="MiB of the checkpoint (a multiple of 64)")
    args = benchkit.begin("object_storage", parser, 840)
    free = shutil.disk_usage("/").free
    count, megabytes = args.objects, args.megabytes
    if free < 8 * 2**30 and (count > 500 or megabytes > 512):
        count, megabytes = min(count, 500), min(megabytes, 512)
        print(f"only {free / 2**30:.1f} GiB free on /: {count} input objects and a {megabytes} MiB checkpoint, "
              f"not {args.objects} and {args.megabytes}", flush=True)
    # The program writes in blocks of 64 MiB; only the periodic upload is kept out of the way (the last one is timed).
    os.environ.update(OUTPUT_SYNC_SECONDS="3600", OUTPUT_FINAL_SYNC_SECONDS="600")
    stop_stale_store()
    store_process = None

    with benchkit.Console(VAR, nodes=2, slots=2) as _console:
        from django.conf import settings
        from django.contrib.auth import get_user_model

        from console import services
        from jobs import localcluster, localstore
        from jobs.code_dirs.service import register
        from jobs.images.recipes import MPI
        from jobs.management.commands.localstore import register as register_store
        from jobs.models import Node, Worker
        from jobs.object_store.client import ObjectStore
        from jobs.runtime.data_in import input_downloads
        from jobs.runtime.node_images import console_archive

        logging.getLogger("asyncssh").setLevel(logging.WARNING)
        try:
            address = localcluster.gateway(settings.LOCALCLUSTER_SUBNET)
            localstore.keys(STORE_STATE)
            store_process = services.start_object_store(localstore.server_argv(STORE_STATE, address, STORE_PORT),
                                                        address, STORE_PORT, VAR / "seaweedfs.log")
            STORE_PID.write_text(str(store_process.pid))
            storage = register_store(localstore.endpoint(address, STORE_PORT), STORE_STATE)
            owner = get_user_model().objects.get(username="admin")
            bucket = storage.user_bucket(owner.pk, owner.username)
            store = ObjectStore(storage.access())
            store.create_bucket(bucket)
            started = time.monotonic()
            fill_bucket(store, bucket, "input/", count)
            print(f"{count} objects of 1 MiB put in s3://{bucket}/input/ (not measured): "
                  f"{time.monotonic() - started:.1f} s", flush=True)
            code = VAR / "code" / "objstore"
            code.mkdir(parents=True, exist_ok=True)
            (code / "objstore.py").write_text(PROGRAM)
            register("objstore", code, sharing="everyone")
            nodes = list(Node.objects.order_by("name"))
            archive = console_archive(MPI.reference)
            assert archive is not None, f"no archive of {MPI.reference}: run manage.py buildimages"
            asyncio.run(benchkit.load_image_on_nodes(nodes, MPI.reference, archive))
            root = settings.NODE_WORK_ROOT.rstrip("/")
            data_url = f"s3://{bucket}/input/"
            # Each node its own NODE_WORK_ROOT, so its own cache, as on hosts with disks of their own: a folder of
            # its own bound over it in the node's mount namespace (gone with it). Binding the cache alone would
            # not do: stage-inputs.py hard-links from the cache into the workdir, and links cannot cross mounts.
            cache = f"{root}/.object-cache"
            asyncio.run(on_nodes(nodes, [f"mkdir -p {root}/.nodes/{node.name} && mount --bind {root}/.nodes/{node.name} "
                                         f"{root}" for node in nodes]))

            # Floor of the stage-in: the same objects, presigned as the console presigns them, fetched by hand.
            urls = [store.presigned_get(bucket, f"input/part-{number:05d}.bin", 3600) for number in range(count)]
            manifest = json.dumps(urls)
            folders = [f"{root}/floor-in-{node.name}" for node in nodes]
            by_hand, said = asyncio.run(on_nodes(
                nodes, [shlex.join(["python3", "-c", FETCH, folder]) for folder in folders], [manifest] * 2))
            assert all(int(line.split()[0]) == count * OBJECT_BYTES for line in said), said
            by_hand_each = [float(line.split()[1]) for line in said]
            asyncio.run(on_nodes(nodes, [shlex.join(["rm", "-rf", folder]) for folder in folders]))
            config = "".join(f'url = "{url}"\noutput = "{{folder}}/{number}"\n' for number, url in enumerate(urls))
            parallel, _ = asyncio.run(on_nodes(
                nodes, [f"mkdir -p {shlex.quote(folder)} && curl -sS --fail -Z --parallel-max 8 -K -" for folder in folders],
                [config.replace("{folder}", folder) for folder in folders]))
            asyncio.run(on_nodes(nodes, [shlex.join(["rm", "-rf", folder]) for folder in folders]))
            print(f"floor: {count} objects by hand on both nodes at once: urllib one at a time {by_hand:.1f} s "
                  f"(each node {by_hand_each[0]:.1f} s, {by_hand_each[1]:.1f} s); curl 8 at a time {parallel:.1f} s",
                  flush=True)

            # The console: a cold node cache, and a checkpoint out.
            first = run_job(owner, "objstore-cold", data_url, f"s3://{bucket}/runs/cold/", megabytes)
            cold = staging(first)
            sent, sent_line = upload(first)
            stored = store.head(bucket, "runs/cold/checkpoint.bin")
            assert stored is not None and stored.size == megabytes * 2**20, (stored, sent_line)
            written = next((line for line in first["text"].splitlines() if "checkpoint written" in line), "")
            print(f"cold job: input ready on both {cold['to_ready']:.1f} s after submission; staging "
                  f"{cold['step']:.1f} s; {cold['lines']}; upload {sent:.1f} s ({sent_line}); {written}", flush=True)

            # Floor of the output: the same size, one presigned PUT by hand from worker-0's node.
            node_zero = [Worker.objects.select_related("node").get(job_id=first["id"], index=0).node]
            source = f"{root}/floor-out/checkpoint.bin"
            asyncio.run(on_nodes(node_zero, [f"mkdir -p {shlex.quote(root)}/floor-out && head -c {megabytes * 2**20} "
                                             f"/dev/urandom > {shlex.quote(source)} && sync"]))
            put_url = store.presigned_put(bucket, "floor/checkpoint-urllib.bin", 3600)
            put_s, said = asyncio.run(on_nodes(node_zero, [shlex.join(["python3", "-c", PUT, source, put_url])]))
            put_own = float(said[0].split()[1])
            curl_url = store.presigned_put(bucket, "floor/checkpoint-curl.bin", 3600)
            curl_s, _ = asyncio.run(on_nodes(node_zero, [shlex.join(["curl", "-sS", "--fail", "-o", "/dev/null",
                                                                     "-T", source, curl_url])]))
            for key in ("floor/checkpoint-urllib.bin", "floor/checkpoint-curl.bin"):
                stored = store.head(bucket, key)
                assert stored is not None and stored.size == megabytes * 2**20, (key, stored)
            asyncio.run(on_nodes(node_zero, [shlex.join(["rm", "-rf", f"{root}/floor-out"])]))
            print(f"floor: one PUT by hand from {node_zero[0].name}: urllib {put_s:.1f} s ({put_own:.1f} s in the program), "
                  f"curl -T {curl_s:.1f} s", flush=True)

            # The console again: the same input, from the node's cache.
            second = run_job(owner, "objstore-warm", data_url, "", 0)
            warm = staging(second)
            assert all("0 bytes fetched" in line for line in warm["lines"].values()), warm["lines"]
            links, _ = asyncio.run(on_nodes(nodes, [f"cp -al {shlex.quote(cache)} {shlex.quote(folder)}"
                                                    for folder in folders]))
            asyncio.run(on_nodes(nodes, [shlex.join(["rm", "-rf", folder]) for folder in folders]))
            started = time.monotonic()
            listed = input_downloads(first["id"])
            presigning = time.monotonic() - started
            assert len(listed) == count
            print(f"warm job: input ready on both {warm['to_ready']:.1f} s after submission; staging "
                  f"{warm['step']:.1f} s; {warm['lines']}; floor: cp -al of the cache on both nodes {links:.2f} s; "
                  f"the console's listing and presigning of {count} objects alone: {presigning:.2f} s", flush=True)
        finally:
            services.stop(store_process, timeout=30)
            STORE_PID.unlink(missing_ok=True)
            shutil.rmtree(STORE_STATE, ignore_errors=True)

    size, checkpoint = mib(count * OBJECT_BYTES), mib(megabytes * 2**20)
    rows = [
        [f"stage-in, cold cache: submission -> input ready on both ({count:,} x 1 MiB)", benchkit.fmt(cold["to_ready"], 1),
         "-", "-"],
        ["stage-in, cold cache: the staging step (fetching -> ready, both workers)", benchkit.fmt(cold["step"], 1),
         benchkit.fmt(by_hand, 1), f"{cold['step'] / by_hand:.2f}"],
        ["  same, floor 2: curl 8 transfers at a time on each node", "", benchkit.fmt(parallel, 1),
         f"{cold['step'] / parallel:.2f}"],
        ["stage-in, cache hit: submission -> input ready on both", benchkit.fmt(warm["to_ready"], 1), "-", "-"],
        ["stage-in, cache hit: the staging step (0 bytes fetched)", benchkit.fmt(warm["step"], 2),
         benchkit.fmt(links, 2), f"{warm['step'] / links:.1f}"],
        [f"output: {checkpoint} checkpoint, the console's last upload (worker-0's container)", benchkit.fmt(sent, 1),
         benchkit.fmt(put_s, 1), f"{sent / put_s:.2f}"],
        ["  same, floor 2: curl -T", "", benchkit.fmt(curl_s, 1), f"{sent / curl_s:.2f}"],
    ]
    print(f"\nobject storage, 2 nodes (namespaces of this machine) and SeaweedFS on {os.cpu_count()} cores; "
          f"{size} of input in {count:,} objects, a {checkpoint} checkpoint; {benchkit.load_line()} at the end")
    print(benchkit.table(["figure", "console s", "floor s", "x floor"], rows))
    print(f"floors: the same presigned objects fetched by hand over SSH on both nodes at once (urllib, one at a "
          f"time, as stage-inputs.py); `cp -al` of the node cache on both nodes; one presigned PUT of a {checkpoint} file "
          f"from worker-0's node (urllib, as outputs-upload.py). Each node has a NODE_WORK_ROOT, so a cache, of its own (a bind "
          f"mount in its mount namespace), as hosts with their own disks have. The console's listing + presigning of "
          f"{count} objects: {presigning:.2f} s.")


if __name__ == "__main__":
    main()
