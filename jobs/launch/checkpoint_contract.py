"""The checkpoint contract between the console and a job's program, whatever its engine (pure).

A job whose train_url names an object store gets, in every worker's environment:
- MA_CHECKPOINT_DIR: a folder under train_url's local folder, uploaded with it (so a checkpoint outlives
  the containers);
- MA_RESUME_FROM, on an attempt that has one to resume from: the newest complete checkpoint, brought back
  into that folder before the start;
- MA_CHECKPOINT_SIGNAL and MA_CHECKPOINT_GRACE, where the job asked for a notice before a stop: the signal
  each rank gets, and the seconds it then has to save one.

A program says it saved a checkpoint by writing, after the checkpoint itself, a small manifest at
$MA_CHECKPOINT_DIR/checkpoint.json (written aside then renamed, so it is never read half-written):

    {"step": 1200, "path": "step-1200.pt"}

`path` is relative to the folder and names a file or a folder of files; `time` (any text) may be added.
The console reads the manifest, uploads what it names and records the checkpoint once every file is in
the store. A manifest it cannot trust (not JSON, a path outside the folder, a file that is not there)
is ignored with a warning on the job's page, never used as a resume point.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

from jobs.launch.data_paths import local_path

CHECKPOINT_FOLDER = "checkpoints"
MANIFEST_NAME = "checkpoint.json"
# The checkpoint folder in the container, and where it is under train_url (the uploaded folder).
CHECKPOINT_DIR = f"{local_path('train_url')}{CHECKPOINT_FOLDER}"
MANIFEST_PATH = f"{CHECKPOINT_DIR}/{MANIFEST_NAME}"
# A manifest is a few fields; more is not one (and the console does not hold what a job prints at it).
MANIFEST_MAX_BYTES = 4096
MAX_STEP = 1 << 62
# The signals a job may choose for its notice: the ones a program can catch and a stop may stand for.
NOTICE_SIGNALS = ("USR1", "USR2", "INT", "TERM")
DEFAULT_NOTICE_SIGNAL = "USR1"


class ManifestError(ValueError):
    """Why a manifest is not trusted, in words for the job's page."""


@dataclass(frozen=True)
class CheckpointClaim:
    """What a manifest says: a checkpoint at `step`, in `path` under the checkpoint folder."""

    step: int
    path: str
    time: str = ""

    @property
    def output_path(self) -> str:
        """Its path under train_url (as the outputs' listing names files)."""
        return f"{CHECKPOINT_FOLDER}/{self.path}"


def parse_manifest(text: str) -> CheckpointClaim:
    """The manifest's claim; ManifestError when it is not one the console trusts."""
    if len(text.encode("utf-8", "surrogateescape")) > MANIFEST_MAX_BYTES:
        raise ManifestError(f"{MANIFEST_NAME} is larger than {MANIFEST_MAX_BYTES} bytes")
    try:
        found = json.loads(text)
    except ValueError as error:
        raise ManifestError(f"{MANIFEST_NAME} is not valid JSON ({error})") from None
    except RecursionError:  # a few thousand nested brackets: no manifest is that deep
        raise ManifestError(f"{MANIFEST_NAME} is nested too deeply to be a manifest") from None
    if not isinstance(found, dict):
        raise ManifestError(f"{MANIFEST_NAME} is not a JSON object")
    step, path, time = found.get("step"), found.get("path"), found.get("time", "")
    if type(step) is not int or not 0 <= step < MAX_STEP:
        raise ManifestError(f"{MANIFEST_NAME}: step must be a whole number from 0")
    if not isinstance(path, str) or not path.strip():
        raise ManifestError(f"{MANIFEST_NAME}: path must name the checkpoint's file or folder")
    # The program's own time is shown as it wrote it, less what no page should show (controls, lone surrogates
    # that JSON escapes can make, direction overrides).
    shown_time = "".join(char for char in str(time)[:64] if char.isprintable()) if time is not None else ""
    return CheckpointClaim(step=step, path=inside_folder(path), time=shown_time)


def inside_folder(path: str) -> str:
    """`path` as a relative path inside the checkpoint folder; ManifestError when it would leave it."""
    text = path.removeprefix(CHECKPOINT_DIR + "/") if path.startswith("/") else path
    if text.startswith("/") or "\x00" in text or any(ord(char) < 32 for char in text):
        raise ManifestError(f"{MANIFEST_NAME}: path {path[:200]!r} is not inside {CHECKPOINT_DIR}")
    if not all(char.isprintable() for char in text):
        # A lone surrogate (which no store key or database text holds) or a direction override (a name that
        # reads as another in a listing): never a name a checkpoint needs.
        raise ManifestError(f"{MANIFEST_NAME}: path {path[:200]!r} holds characters a checkpoint's name may not")
    normal = posixpath.normpath(text).strip("/")
    if normal in ("", ".") or normal == ".." or normal.startswith("../"):
        raise ManifestError(f"{MANIFEST_NAME}: path {path[:200]!r} is not inside {CHECKPOINT_DIR}")
    if normal == MANIFEST_NAME:
        raise ManifestError(f"{MANIFEST_NAME}: path names the manifest itself, not a checkpoint")
    return normal


def claimed_files(claim: CheckpointClaim, found: dict[str, int]) -> dict[str, int]:
    """The files of the output folder (path -> size) that make up the claimed checkpoint: the file it names,
    or every file under the folder it names. ManifestError when there is none."""
    prefix = claim.output_path
    files = {path: size for path, size in found.items() if path == prefix or path.startswith(prefix + "/")}
    if not files:
        raise ManifestError(f"{MANIFEST_NAME} names {claim.path}, which is not in {CHECKPOINT_DIR}")
    return files


def checkpoint_variables(has_object_output: bool, resume_from: str, grace_seconds: int,
                         signal: str) -> dict[str, str]:
    """The contract's variables of one worker: the folder and the resume point only where train_url is in an
    object store (elsewhere nothing would outlive the containers), the notice wherever the job asked for one."""
    found = {}
    if has_object_output:
        found["MA_CHECKPOINT_DIR"] = CHECKPOINT_DIR
        if resume_from:
            found["MA_RESUME_FROM"] = f"{CHECKPOINT_DIR}/{resume_from}"
    if grace_seconds > 0:
        found["MA_CHECKPOINT_SIGNAL"] = f"SIG{signal}"
        found["MA_CHECKPOINT_GRACE"] = str(grace_seconds)
    return found
