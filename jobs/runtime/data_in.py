"""A job's object-store input, brought to each worker's node before its container starts.

The console lists the input with the store's keys (after checking the bucket is the user's own), or with the
user's own keys to the store for another bucket, and presigns one GET per object; the node's root fetches each object straight from the store into a cache of
the node's (stage-inputs.py), so nothing passes through the console and no key leaves it. The worker's
container then mounts the input read-only at /home/ma-user/modelarts/inputs.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import asyncssh
from django.conf import settings

from jobs.launch.checkpoint_contract import CHECKPOINT_FOLDER
from jobs.launch.data_paths import TRAIN_URL_FOLDER, folder_of, object_inputs, object_url_of
from jobs.launch.plan import WorkerPlan
from jobs.logs.store import readable_size
from jobs.models import Storage, TrainingJob
from jobs.object_store.client import StoreError
from jobs.object_store.urls import MAX_INPUT_OBJECTS, ObjectUrlError, parse_object_url, safe_key_part
from jobs.runtime.containers import JOB_UID, as_node_root
from jobs.runtime.ssh import NodeError

STAGE_SCRIPT = (Path(__file__).resolve().parent / "node_scripts" / "stage-inputs.py").read_text()
# Long enough for the slowest staging the console waits for; a URL is good for this job's staging only.
URL_LIFETIME_S = 6 * 3600


@dataclass(frozen=True)
class Download:
    path: str  # in the worker's inputs folder: data_url_0/<key under the prefix>
    url: str  # presigned GET: a bearer of the user's read access, never logged or shown
    size: int
    cache_key: str  # the store, the object and its version: the same bytes, wherever a job names them
    # Listed with the user's own keys: the store may let them list what it does not let them read, so a copy in
    # the node's cache is handed over only once the store answered this URL (stage-inputs.py).
    check_access: bool = False


# The modification time a file brought back from train_url gets (stage-inputs.py): unchanged since, it is
# not uploaded again.
PREDOWNLOADED_MTIME_NS = 1_000_000_000
# Where train_url's files come back to, under the worker's folder (the container's /home/ma-user/modelarts/outputs).
OUTPUTS_TARGET = "home/modelarts/outputs"


@dataclass(frozen=True)
class Staging:
    """What a worker's node fetches before its container starts, and where it goes."""

    downloads: tuple[Download, ...]
    # Under the worker's folder: the input (root's, mounted read-only), or the output folder of the job's home.
    target: str = "inputs"
    # Copied and owned by the job's uid (a train_url brought back, which the program rewrites), not linked.
    owned: bool = False
    what: str = "input"


def input_downloads(job_id: int) -> list[Download]:
    """What each worker fetches for the job's inputs, data_url and data_url_1 ... ([] when none names an object
    store), each into its own folder."""
    downloads: list[Download] = []
    for name, text in object_inputs(_parameters(job_id)):
        found = _downloads(job_id, name, folder_of(name))
        if not found:
            raise NodeError("console", f"listing {name}", f"{text} holds no object")
        downloads += found
    return downloads


def output_downloads(job_id: int) -> list[Download]:
    """What each worker brings back of the job's train_url before the start ([] when it holds nothing yet)."""
    return _downloads(job_id, "train_url", TRAIN_URL_FOLDER) or []


def checkpoint_downloads(job_id: int, url_text: str, path: str) -> list[Download]:
    """What each worker brings back of the checkpoint an attempt resumes from (its file, or its folder's files),
    into the checkpoint folder under train_url's; NodeError when it is no longer in the store."""
    job = TrainingJob.objects.select_related("owner").get(pk=job_id)
    try:
        url = parse_object_url(url_text)
        if url is None:
            raise ObjectUrlError("not an object URL")
        where = Storage.reach_for(url_text, job.pool_id, job.owner_id, job.owner.username)
        key = url.prefix.rstrip("/")
        found = [item for item in where.store.objects(url.bucket, key, MAX_INPUT_OBJECTS)
                 if item.key == key or item.key.startswith(key + "/")]
        downloads = []
        for item in found:
            relative = item.key[len(key):].lstrip("/")
            if relative and not safe_key_part(relative):
                continue
            target = f"{TRAIN_URL_FOLDER}/{CHECKPOINT_FOLDER}/{path}" + (f"/{relative}" if relative else "")
            downloads.append(Download(
                path=target, url=where.store.presigned_get(url.bucket, item.key, URL_LIFETIME_S), size=item.size,
                cache_key=f"{where.endpoint_url}|{url.bucket}|{item.key}|{item.etag}|{item.size}",
                check_access=where.with_own_keys))
    except (ObjectUrlError, StoreError) as error:
        raise NodeError("console", "bringing the checkpoint back", f"{url_text}: {error}") from error
    if not downloads:
        raise NodeError("console", "bringing the checkpoint back", f"{url_text} is no longer in the store")
    return downloads


def _parameters(job_id: int) -> tuple[tuple[str, str], ...]:
    return TrainingJob.objects.get(pk=job_id).parameter_pairs()


def _downloads(job_id: int, name: str, folder: str) -> list[Download] | None:
    """The objects under the job's `name` URL, each as a download into `folder`; None when it names no store."""
    job = TrainingJob.objects.select_related("owner").get(pk=job_id)
    text = object_url_of(job.parameter_pairs(), name)
    if not text:
        return None
    try:
        url = parse_object_url(text)
        assert url is not None
        where = Storage.reach_for(text, job.pool_id, job.owner_id, job.owner.username)
        prefix = url.folder_prefix
        downloads = []
        for item in where.store.objects(url.bucket, prefix, MAX_INPUT_OBJECTS):
            relative = item.key[len(prefix):]
            if item.key.endswith("/") and item.size == 0:
                continue  # a folder marker, as some tools make them
            if not safe_key_part(relative):
                raise ObjectUrlError(f"the object {item.key!r} cannot be a file's path (an empty, '.' or '..' part, "
                                     "or a control character)")
            downloads.append(Download(
                path=f"{folder}/{relative}",
                url=where.store.presigned_get(url.bucket, item.key, URL_LIFETIME_S),
                size=item.size,
                cache_key=f"{where.endpoint_url}|{url.bucket}|{item.key}|{item.etag}|{item.size}",
                check_access=where.with_own_keys))
    except (ObjectUrlError, StoreError) as error:
        raise NodeError("console", f"listing {name}", f"{text}: {error}") from error
    return downloads


ProgressSay = Callable[[str], Awaitable[None]]


def counted_files(count: int) -> str:
    # English only: the pages say these messages in their language by their shapes (jobs.pages.display).
    return "1 file" if count == 1 else f"{count} files"


def progress_words(line: str, total_files: int, total_bytes: int) -> str:
    """stage-inputs.py's progress or final line in words: files and bytes so far, the fetch rate, the cache."""
    fields = dict(word.split("=", 1) for word in line.split()[1:] if "=" in word)
    files, done = int(fields.get("files", 0)), int(fields.get("bytes", 0))
    fetched, seconds = int(fields.get("fetched", 0)), float(fields.get("seconds", 0))
    if line.startswith("staged "):
        return (f"input ready: {counted_files(files)}, {readable_size(done)} in {seconds:.1f} s; {readable_size(fetched)} "
                f"fetched from the store, {readable_size(done - fetched)} from the node's cache")
    rate = readable_size(int(fetched / max(seconds, 0.001)))
    return f"input: {files}/{total_files} files, {readable_size(done)} of {readable_size(total_bytes)}, {rate}/s"


async def stage_inputs(connection: asyncssh.SSHClientConnection, worker: WorkerPlan, staging: Staging,
                       say: ProgressSay) -> None:
    """Fetch what the staging names onto the worker's node (under its folder), saying how it goes."""
    label = worker.node.label
    downloads = staging.downloads
    total_files, total_bytes = len(downloads), sum(item.size for item in downloads)
    await say(f"{staging.what}: fetching {counted_files(total_files)}, {readable_size(total_bytes)}, onto {label}")
    argv = ["python3", "-c", STAGE_SCRIPT, worker.workdir, f"{worker.work_root}/.object-cache",
            str(settings.NODE_CACHE_GB * 1024**3), str(settings.NODE_DISK_RESERVE_GB * 1024**3)]
    if staging.owned:
        argv += [staging.target, str(JOB_UID)]
    argv = as_node_root(worker, argv)
    last = ""
    try:
        async with connection.create_process(shlex.join(argv)) as process:
            process.stdin.write(json.dumps([asdict(item) for item in downloads]))
            process.stdin.write_eof()
            async for line in process.stdout:
                if not line.strip():
                    continue
                last = line.strip()
                if last.startswith(("progress ", "staged ")):
                    await say(progress_words(last, total_files, total_bytes).replace("input", staging.what, 1))
            errors = str(await process.stderr.read())
            await process.wait()
    except (OSError, asyncssh.Error) as error:
        raise NodeError(label, f"fetching the {staging.what}", str(error)) from error
    if process.exit_status != 0 or not last.startswith("staged "):
        reason = last.removeprefix("error ") if last.startswith("error ") else \
            f"exit status {process.exit_status}: {errors.strip()[-300:]}"
        raise NodeError(label, f"fetching the {staging.what}", reason)
