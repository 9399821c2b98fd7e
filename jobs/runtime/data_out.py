"""A job's object-store output: what the program writes under its train_url's local folder, uploaded to
train_url while the job runs and once more when it ends (completed, failed, stopped).

Worker-0's container lists the folder and uploads each changed file itself, as the job's user, to a PUT
URL the console presigned for that one object (outputs-list.py, outputs-upload.py, through the container's
own sshd): the bytes go from the node to the store, the keys stay in the console, and only what the job's
user could read is sent (links are not followed).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import shlex
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import asyncssh

from jobs.launch.data_paths import local_path, object_url_of
from jobs.launch.network_policy import AllowedDestination
from jobs.launch.plan import SshTarget
from jobs.logs.store import readable_size
from jobs.models import TrainingJob
from jobs.object_store.access import Reach, reach
from jobs.object_store.client import StoreError
from jobs.object_store.urls import ObjectUrlError, parse_object_url, safe_key_part
from jobs.results.outputs import FoundFile, OutputsResult
from jobs.runtime.data_in import storage_for
from jobs.runtime.preparation import NODE_SCRIPTS
from jobs.runtime.ssh import NodeError, connect

logger = logging.getLogger(__name__)

LIST_SCRIPT = (NODE_SCRIPTS / "outputs-list.py").read_text()
UPLOAD_SCRIPT = (NODE_SCRIPTS / "outputs-upload.py").read_text()
MAX_OUTPUT_FILES = 10000
PUT_URL_LIFETIME_S = 3600
FOLDER = local_path("train_url").rstrip("/")


def output_reach(job_id: int) -> tuple[str, Reach] | None:
    """(train_url, where it reaches) for a job whose train_url names an object store; None otherwise."""
    job = TrainingJob.objects.select_related("owner").get(pk=job_id)
    text = object_url_of(job.launch_values().parameters, "train_url")
    if not text:
        return None
    url = parse_object_url(text)
    assert url is not None
    return text, reach(text, storage_for(url.scheme, job.pool_id), job.owner_id, job.owner.username)


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

    async def sync(self) -> None:
        """One look: list the folder, upload what is new or changed. NodeError when the container cannot be asked."""
        async with self.busy:
            await self._sync()

    async def _sync(self) -> None:
        try:
            connection = await connect(self.target)
            async with connection:
                files = await self._listing(connection)
                changed = sorted(path for path, seen in files.items() if self.sent.get(path) != seen)
                manifest = self._manifest(changed)
                if not manifest:
                    return
                upload = await connection.run(shlex.join(["python3", "-c", UPLOAD_SCRIPT, FOLDER]),
                                              input=json.dumps(manifest), check=False, timeout=3600)
        except (OSError, asyncssh.Error, ValueError) as error:
            raise NodeError(self.target.label, "uploading the outputs", str(error) or type(error).__name__) from error
        self._take_results(str(upload.stdout or ""), files)
        for item in manifest:
            if self.sent.get(item["path"]) != files[item["path"]]:
                self.failed.setdefault(item["path"], "the upload did not answer")

    async def _listing(self, connection: asyncssh.SSHClientConnection) -> dict[str, tuple[int, int]]:
        listing = await connection.run(shlex.join(["python3", "-c", LIST_SCRIPT, FOLDER, str(MAX_OUTPUT_FILES)]),
                                       check=False, timeout=120)
        answer = json.loads(str(listing.stdout or "").strip() or "{}")
        if "error" in answer or "files" not in answer:
            raise NodeError(self.target.label, "listing the outputs",
                            str(answer.get("error") or str(listing.stderr or "")[-300:] or "no answer"))
        files = {str(path): (int(size), int(mtime)) for path, size, mtime in answer["files"]}
        self.found = {path: size for path, (size, _) in files.items()}
        return files

    def _manifest(self, changed: list[str]) -> list[dict[str, str]]:
        manifest = []
        for path in changed:
            if not safe_key_part(path):
                self.failed[path] = "its name cannot be an object's key"
                continue
            key = self.where.url.folder_prefix + path
            manifest.append({"path": path, "url": self.where.store.presigned_put(self.where.url.bucket, key,
                                                                                 PUT_URL_LIFETIME_S)})
        return manifest

    def _take_results(self, output: str, files: dict[str, tuple[int, int]]) -> None:
        for line in output.splitlines():
            try:
                result = json.loads(line)
            except ValueError:
                continue
            path = str(result.get("path", ""))
            if path not in files:
                continue
            if "error" in result:
                self.failed[path] = str(result["error"])
            else:
                self.sent[path] = files[path]
                self.failed.pop(path, None)

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
        if not_saved:
            named = ", ".join(not_saved[:5]) + (f" and {len(not_saved) - 5} more" if len(not_saved) > 5 else "")
            why = problem or self.failed.get(not_saved[0], "")
            return OutputsResult("upload_partial", f"Uploaded {len(uploaded)} of {len(files)} file(s) to {self.train_url}; "
                                 f"not saved: {named} ({why}).", files, uploaded)
        return OutputsResult("uploaded", f"Uploaded {len(files)} file(s), {readable_size(total)}, to {self.train_url}.",
                             files, uploaded)


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
