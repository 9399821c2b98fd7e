"""A job's object-store output: what the program writes under its train_url's local folder, uploaded to
train_url while the job runs and once more when it ends (completed, failed, stopped).

Worker-0's container lists the folder and uploads each changed file itself, as the job's user, to a PUT
URL the console presigned for that one object (outputs-list.py, outputs-upload.py, through the container's
own sshd): the bytes go from the node to the store, the keys stay in the console, and only what the job's
user could read is sent (links are not followed).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import shlex
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import asyncssh
from asgiref.sync import sync_to_async
from django.conf import settings

from jobs.launch.data_paths import local_path, object_url_of
from jobs.launch.network_policy import AllowedDestination
from jobs.launch.plan import SshTarget
from jobs.logs.store import readable_size
from jobs.models import OpenUpload as OpenUploadRow
from jobs.models import Storage, TrainingJob
from jobs.object_store.access import Reach
from jobs.object_store.client import StoreError, StoreUnreachable
from jobs.object_store.parts import PartPlan, part_plan, parts_taken
from jobs.object_store.urls import ObjectUrlError, safe_key_part
from jobs.results.outputs import FoundFile, OutputsResult
from jobs.runtime.preparation import NODE_SCRIPTS
from jobs.runtime.ssh import NodeError, connect

logger = logging.getLogger(__name__)

LIST_SCRIPT = (NODE_SCRIPTS / "outputs-list.py").read_text()
UPLOAD_SCRIPT = (NODE_SCRIPTS / "outputs-upload.py").read_text()
MAX_OUTPUT_FILES = 10000
PUT_URL_LIFETIME_S = 3600
# A file in parts may take longer than an hour: its parts' URLs last as long as its upload at this slow a rate
# would, within the week SigV4 allows a presigned URL.
SLOWEST_UPLOAD_BYTES_A_SECOND = 10 * 1024 * 1024
LONGEST_URL_LIFETIME_S = 7 * 24 * 3600
FOLDER = local_path("train_url").rstrip("/")


# What one file's line of a listing or an upload's answer may take (a path of at most 1,024 bytes, escaped).
ANSWER_BYTES_A_FILE = 4 * 1024 + 128
# And what each part's ETag adds to a file's answer (PART_ETAG, quoted, with JSON's quotes and comma).
ANSWER_BYTES_A_PART = 140


def well_formed(entry: object) -> bool:
    """One listing entry as outputs-list.py writes it: [path, size, mtime_ns], a path and two whole numbers."""
    return (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and 0 < len(entry[0]) <= 4096
            and all(type(number) is int and 0 <= number < 1 << 63 for number in entry[1:]))


def readable_name(path: str) -> str:
    return path.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")[:200]


async def bounded_run(connection: asyncssh.SSHClientConnection, argv: list[str], stdin: str, *, limit: int,
                      timeout: float) -> str:  # noqa: ASYNC109 - the command's own deadline, as asyncssh's run takes it
    """A command's stdout, read up to `limit` bytes: past it the command is ended and NodeError raised (what
    answers may be the job's own programs, and the console must not hold whatever they print)."""
    async with asyncio.timeout(timeout):
        async with connection.create_process(shlex.join(argv), encoding=None) as process:
            if stdin:
                process.stdin.write(stdin.encode())
            process.stdin.write_eof()
            output = b""
            while chunk := await process.stdout.read(65536):
                output += chunk
                if len(output) > limit:
                    process.kill()
                    raise NodeError("worker-0", "reading the outputs' answer", f"more than {limit} bytes")
            await process.wait()
    return output.decode("utf-8", "surrogateescape")


def output_reach(job_id: int) -> tuple[str, Reach] | None:
    """(train_url, where it reaches) for a job whose train_url names an object store; None otherwise."""
    job = TrainingJob.objects.select_related("owner").get(pk=job_id)
    text = object_url_of(job.parameter_pairs(), "train_url")
    if not text:
        return None
    return text, Storage.reach_for(text, job.pool_id, job.owner_id, job.owner.username)


def parts_url_lifetime(size: int) -> int:
    """How long the part URLs of a file of `size` bytes stay good: the whole upload at the slowest rate allowed."""
    return min(PUT_URL_LIFETIME_S + -(-size // SLOWEST_UPLOAD_BYTES_A_SECOND), LONGEST_URL_LIFETIME_S)


def upload_time_limit(sizes: Iterable[int]) -> int:
    """How long one look's uploads of files of these sizes may take: all of them at the slowest rate allowed."""
    return parts_url_lifetime(sum(sizes))


@dataclass(frozen=True)
class OpenUpload:
    """A multipart upload opened for one file of the output, until it is completed or aborted."""

    key: str
    upload_id: str
    plan: PartPlan


@dataclass
class OutputSync:
    """The uploads of one run: what was sent (so a look sends only what changed since) and what failed."""

    train_url: str
    where: Reach
    target: SshTarget
    sent: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (size, mtime_ns) when sent
    found: dict[str, int] = field(default_factory=dict)  # path -> size, at the last look
    failed: dict[str, str] = field(default_factory=dict)  # path -> why its last upload failed
    # One look at a time: a stop's last upload may come while the periodic one is under way.
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The job whose uploads these are: each multipart upload opened is kept in the database until it is joined
    # or aborted (None: not kept, for a sync with no job behind it).
    job_id: int | None = None
    # The uploads this sync opened: those of the job's it did not are a dead process's, aborted at its next look.
    opened: set[str] = field(default_factory=set)
    # A dead process's uploads are all ended (only one from before this sync can be one): no look asks again.
    swept: bool = False

    async def sync(self) -> None:
        """One look: list the folder, upload what is new or changed. NodeError when the container cannot be asked."""
        async with self.busy:
            await self._sync()

    async def _sync(self) -> None:
        uploads: dict[str, OpenUpload] = {}
        await self._abort_left_open()
        try:
            try:
                connection = await connect(self.target)
                async with connection:
                    files = await self._listing(connection)
                    changed = sorted(path for path, seen in files.items() if self.sent.get(path) != seen)
                    manifest = await self._manifest(changed, files, uploads)
                    if not manifest:
                        return
                    # One short line a file (and an ETag a part); more is not an answer of the upload script's.
                    limit = sum(ANSWER_BYTES_A_FILE + ANSWER_BYTES_A_PART * len(item.get("parts", {}).get("urls", []))
                                for item in manifest)
                    # As long as the files' upload takes at the slowest rate allowed: a large checkpoint is not cut
                    # off at an hour, only to be started again from its first byte at the next look.
                    answer = await bounded_run(connection, ["python3", "-c", UPLOAD_SCRIPT, FOLDER], json.dumps(manifest),
                                               limit=limit, timeout=upload_time_limit(files[path][0] for path in changed))
            except (OSError, asyncssh.Error, ValueError) as error:
                raise NodeError(self.target.label, "uploading the outputs", str(error) or type(error).__name__) from error
            asked = {str(item["path"]): files[str(item["path"])] for item in manifest}
            await self._take_results(answer, asked, uploads)
            for path in asked:
                if self.sent.get(path) != asked[path]:
                    self.failed.setdefault(path, "the upload did not answer")
        finally:
            # Whatever was not completed (a failed part, a node that stopped answering, a stop) is aborted: its
            # parts would otherwise take room in the store for nothing.
            await asyncio.shield(self._abort(list(uploads.values())))

    async def _listing(self, connection: asyncssh.SSHClientConnection) -> dict[str, tuple[int, int]]:
        """The output folder's files: (size, mtime_ns) by path. What answers runs in the job's container, so the
        answer is read as untrusted: bounded in bytes and files, every entry checked."""
        text = await bounded_run(connection, ["python3", "-c", LIST_SCRIPT, FOLDER, str(MAX_OUTPUT_FILES)], "",
                                 limit=ANSWER_BYTES_A_FILE * (MAX_OUTPUT_FILES + 1), timeout=120)
        answer = json.loads(text.strip() or "{}")
        if not isinstance(answer, dict) or not isinstance(answer.get("files"), list):
            reason = answer.get("error") if isinstance(answer, dict) else None
            raise NodeError(self.target.label, "listing the outputs", str(reason or "no listing")[:300])
        entries = answer["files"]
        if len(entries) > MAX_OUTPUT_FILES or not all(well_formed(entry) for entry in entries):
            raise NodeError(self.target.label, "listing the outputs", "the listing is not one the console reads")
        files = {path: (size, mtime) for path, size, mtime in entries}
        self.found = {path: size for path, (size, _) in files.items() if safe_key_part(path)}
        for path in files:
            if not safe_key_part(path):
                self.failed[readable_name(path)] = "its name cannot be an object's key (not UTF-8, too long, or a '..' part)"
        if answer.get("more"):
            self.failed["…"] = f"the folder holds more than {MAX_OUTPUT_FILES} files: only that many are uploaded"
        return {path: seen for path, seen in files.items() if path in self.found}

    async def _manifest(self, changed: list[str], files: dict[str, tuple[int, int]],
                        uploads: dict[str, OpenUpload]) -> list[dict[str, Any]]:
        """What the upload script is given: a presigned PUT a file, or for a file larger than a part (its size at
        the listing) a multipart upload opened now and a presigned URL a part, kept in `uploads`."""
        manifest: list[dict[str, Any]] = []
        bucket = self.where.url.bucket
        for path in changed:
            key = self.where.url.folder_prefix + path
            size = files[path][0]
            plan = part_plan(size, settings.OUTPUT_PART_BYTES)
            if plan is None:
                manifest.append({"path": path, "url": self.where.store.presigned_put(bucket, key, PUT_URL_LIFETIME_S)})
                continue
            starting = asyncio.ensure_future(asyncio.to_thread(self.where.store.start_multipart, bucket, key))
            try:
                upload_id = await asyncio.shield(starting)
            except asyncio.CancelledError:
                # Cancelled (a stop, mpirun's end) while the store opened it: it is kept, so the sync's end aborts it.
                with contextlib.suppress(Exception):
                    uploads[path] = OpenUpload(key, await starting, plan)
                raise
            except StoreError as error:
                self.failed[path] = str(error)[:300]
                continue
            uploads[path] = OpenUpload(key, upload_id, plan)
            await self._keep(key, upload_id)
            lifetime = parts_url_lifetime(size)
            urls = [self.where.store.presigned_part(bucket, key, upload_id, number, lifetime)
                    for number in range(1, plan.count + 1)]
            manifest.append({"path": path, "parts": {"size": size, "part_bytes": plan.part_bytes, "urls": urls}})
        return manifest

    async def _take_results(self, output: str, asked: dict[str, tuple[int, int]],
                            uploads: dict[str, OpenUpload]) -> None:
        """The upload script's answers, taken only for the files it was asked to upload; a file sent in parts
        counts once the store has joined them."""
        answered: set[str] = set()
        for line in output.splitlines():
            try:
                result = json.loads(line)
            except ValueError:
                continue
            path = result.get("path") if isinstance(result, dict) else None
            # One answer a file, the first: what answers is the job's container, which may say more.
            if not isinstance(path, str) or path not in asked or path in answered:
                continue
            answered.add(path)
            if "error" in result:
                self.failed[path] = str(result["error"])[:300]
            elif path in uploads:
                # Counted only once the store has joined its parts; left in `uploads` (aborted) otherwise.
                if await self._complete(path, uploads[path], result.get("etags")):
                    del uploads[path]
                    self.sent[path] = asked[path]
                    self.failed.pop(path, None)
            else:
                self.sent[path] = asked[path]
                self.failed.pop(path, None)

    async def _complete(self, path: str, upload: OpenUpload, answer: object) -> bool:
        """Join a file's parts; False, with the reason kept, when that cannot be done (the sync's end aborts it)."""
        etags = parts_taken(answer, upload.plan)
        if etags is None:
            self.failed[path] = "its parts' upload did not answer one ETag a part"
            return False
        try:
            await asyncio.to_thread(self.where.store.complete_multipart, self.where.url.bucket, upload.key,
                                    upload.upload_id, etags)
        except StoreError as error:
            self.failed[path] = str(error)[:300]
            return False
        await self._forget(upload.upload_id)
        return True

    async def _abort(self, uploads: list[OpenUpload]) -> None:
        for upload in uploads:
            await self._abort_one(upload.key, upload.upload_id)

    async def _abort_one(self, key: str, upload_id: str) -> bool:
        """Abort one upload; False when the store could not be asked (it stays kept, for the next look)."""
        try:
            await asyncio.to_thread(self.where.store.abort_multipart, self.where.url.bucket, key, upload_id)
        except StoreUnreachable as error:
            logger.warning("could not abort the multipart upload of %s: %s", key, error)
            return False
        except StoreError as error:  # refused (already gone, or no longer the console's to end): nothing more to do
            logger.warning("could not abort the multipart upload of %s: %s", key, error)
        await self._forget(upload_id)
        return True

    async def _abort_left_open(self) -> None:
        """Abort the job's multipart uploads that a console process opened and did not end (it died between)."""
        if self.job_id is None or self.swept:
            return
        left = await sync_to_async(_kept_uploads)(self.job_id, self.where.url.folder_prefix, frozenset(self.opened))
        ended = [await self._abort_one(key, upload_id) for key, upload_id in left]
        self.swept = all(ended)

    async def _keep(self, key: str, upload_id: str) -> None:
        self.opened.add(upload_id)
        if self.job_id is not None:
            await sync_to_async(OpenUploadRow.objects.create)(job_id=self.job_id, key=key, upload_id=upload_id)

    async def _forget(self, upload_id: str) -> None:
        self.opened.discard(upload_id)
        if self.job_id is not None:
            await sync_to_async(_forget_upload)(self.job_id, upload_id)

    def result(self, problem: str = "") -> OutputsResult:
        """What became of the output, for the job's page (the files found at the last look)."""
        files = [FoundFile(path, size) for path, size in sorted(self.found.items())]
        uploaded = {path for path in self.found if path in self.sent and path not in self.failed}
        total = sum(self.found.values())
        if problem and not self.found:
            return OutputsResult("upload_failed", f"The outputs could not be uploaded to {self.train_url}: {problem}",
                                 files, uploaded)
        if not self.found:
            return OutputsResult("empty", f"The output folder ({FOLDER}) held no file; nothing was uploaded.")
        not_saved = sorted(path for path in self.found if path not in uploaded)
        not_saved += sorted(path for path in self.failed if path not in self.found)  # names no key can hold
        if not_saved:
            named = ", ".join(not_saved[:5]) + (f" and {len(not_saved) - 5} more" if len(not_saved) > 5 else "")
            why = problem or self.failed.get(not_saved[0], "")
            return OutputsResult("upload_partial", f"Uploaded {len(uploaded)} of {len(files)} file(s) to {self.train_url}; "
                                 f"not saved: {named} ({why}).", files, uploaded)
        return OutputsResult("uploaded", f"Uploaded {len(files)} file(s), {readable_size(total)}, to {self.train_url}.",
                             files, uploaded)


def _kept_uploads(job_id: int, prefix: str, ours: frozenset[str]) -> list[tuple[str, str]]:
    """The job's kept uploads under its output's prefix that this sync did not open."""
    rows = OpenUploadRow.objects.filter(job_id=job_id, key__startswith=prefix).values_list("key", "upload_id")
    return [(key, upload_id) for key, upload_id in rows if upload_id not in ours]


def _forget_upload(job_id: int, upload_id: str) -> None:
    OpenUploadRow.objects.filter(job_id=job_id, upload_id=upload_id).delete()


def describe_reach_error(error: ObjectUrlError | StoreError) -> OutputsResult:
    return OutputsResult("upload_failed", f"The outputs could not be uploaded: {error}")


def store_destination(endpoint_url: str) -> tuple[AllowedDestination, ...]:
    """The store's address and port, as a destination the job's network policy lets worker-0 reach."""
    parts = urlsplit(endpoint_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(parts.hostname or "", port, proto=socket.IPPROTO_TCP)}
    except OSError:
        return ()
    return tuple(AllowedDestination(ipaddress.ip_network(address.split("%", 1)[0]), port, port)
                 for address in sorted(addresses))
