"""What tc sends: a job document (the API's submission body, in YAML or JSON) with flags on top, a code
folder as a zip, and log lines as text for a terminal."""

import json
import re
import tempfile
import zipfile
from pathlib import Path
from typing import IO

import yaml

from .errors import BadInput

# A job's detail holds these besides its submission; `tc rebuild` leaves them out when the schema cannot say.
READ_ONLY_FIELDS = {"id", "owner", "status", "status_message", "spec_display", "command_template", "command",
                    "hostfile", "tune_file", "sshd_port", "workers", "exit_code", "stop_reason", "created_at",
                    "started_at", "ended_at", "duration_seconds", "log_line_count", "final_metrics", "waiting_reason",
                    "restart_count", "slurm", "checkpoints", "attempts"}
SKIPPED_IN_CODE = {".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache"}
MPIRUN_LINE_PREFIX = "[mpirun] "
SERVICE_LOG_PREFIX = "[ModelArts Service Log]"
# What a terminal would act on rather than show: C0 controls but tab, DEL, and C1 (\x9b starts a control
# sequence as ESC [ does); the same as the console's log files (jobs.logs.store.TERMINAL_CONTROLS).
CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# The same, tab and newlines included, for a value that must stay on its line (a table's cell).
CELL_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def visible(text: str, controls: re.Pattern[str] = CONTROLS) -> str:
    """The text with each terminal control written as its escape (\\x1b), so a job's text cannot act on the
    terminal it is printed to."""
    return controls.sub(lambda match: f"\\x{ord(match.group()):02x}" if ord(match.group()) < 0x100
                        else f"\\u{ord(match.group()):04x}", text)


def load_document(path: str) -> dict:
    """A job document: a mapping of the submission's fields, in YAML (JSON is YAML too); `-` reads stdin."""
    try:
        text = Path("/dev/stdin").read_text() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise BadInput(f"cannot read {path}: {error.strerror or error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise BadInput(f"{path} is not valid YAML or JSON{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInput(f"{path} must hold a mapping of the job's fields, such as name: ..., engine: ...")
    return data


def pairs(items: list[str], what: str) -> list[tuple[str, str]]:
    found = []
    for item in items:
        name, sign, value = item.partition("=")
        if not sign or not name.strip():
            raise BadInput(f"{what} {item!r} must be NAME=VALUE")
        found.append((name.strip(), value))
    return found


def with_flags(document: dict, flags: dict, parameters: list[str], env: list[str]) -> dict:
    """The document with the flags given laid over it: a flag's field replaces the document's, a --param or
    --env replaces the one of the same name or is added."""
    body = dict(document)
    body.update({field: value for field, value in flags.items() if value is not None})
    if parameters:
        given = body.get("parameters") or []
        if not isinstance(given, list):
            raise BadInput("the document's parameters must be a list of {name, value}")
        named = dict(pairs(parameters, "--param"))
        given = [item for item in given if not (isinstance(item, dict) and item.get("name") in named)]
        body["parameters"] = given + [{"name": name, "value": value} for name, value in named.items()]
    if env:
        given_env = body.get("env") or {}
        if not isinstance(given_env, dict):
            raise BadInput("the document's env must be a mapping of NAME: value")
        body["env"] = {**given_env, **dict(pairs(env, "--env"))}
    return body


def submission_of(detail: dict, writable: set[str] | None) -> dict:
    """A job's detail as a submission: its writable fields (from the schema), else all but the read-only ones."""
    if writable:
        return {name: value for name, value in detail.items() if name in writable}
    return {name: value for name, value in detail.items() if name not in READ_ONLY_FIELDS}


def zipped_folder(folder: Path, top: str) -> IO[bytes]:
    """The folder as a zip under one top folder (the console takes it off), in a temporary file."""
    if not folder.is_dir():
        raise BadInput(f"{folder} is not a folder")
    archive = tempfile.TemporaryFile(suffix=".zip")
    count = 0
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as writer:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if any(part in SKIPPED_IN_CODE for part in relative.parts) or path.suffix == ".pyc":
                continue
            if path.is_file():
                writer.write(path, f"{top}/{relative.as_posix()}")
                count += 1
    if not count:
        raise BadInput(f"{folder} holds no file to upload")
    archive.seek(0)
    return archive


def line_text(line: dict) -> str:
    """A log line as the console's log files show it: the platform's lines marked, ranks tagged, terminal
    controls made visible."""
    text = visible(str(line.get("text", "")))
    if line.get("stream") == "system":
        return f"{SERVICE_LOG_PREFIX}{text}"
    if line.get("rank") is not None:
        return f"[rank {line['rank']}] {text}"
    # mpirun's own lines, marked as the console's files mark them: nothing a job prints reads as the platform's.
    return f"{MPIRUN_LINE_PREFIX}{text}"


def dumps(data) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)
