"""The nccl package on its own: `python -m nccl`, no Django, structured records, a reader fed as the log grows."""

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from nccl import NcclLogReader, format_summary_text, parse_nccl_file, parse_nccl_log, parse_nccl_text

ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = ROOT / "tests" / "data" / "nccl-logs"
ALL_LOGS = sorted(LOG_DIR.glob("*.log"))
MPIRUN_TAG = re.compile(r"\[1,(\d+)\]<(stdout|stderr)>:")
# The logs whose lines carry mpirun's "[1,R]<stdout>:" tag, as printed with --tag-output.
TAGGED_LOGS = [path for path in ALL_LOGS
               if any(MPIRUN_TAG.match(line) for line in path.read_text(encoding="utf-8").splitlines())]


def run_nccl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nccl", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def log_path(prefix: str) -> Path:
    (path,) = [p for p in ALL_LOGS if p.name.startswith(prefix + "-")]
    return path


def as_records(lines: list[str]) -> list[tuple]:
    """Split mpirun's tag off each line, as the launcher does before it stores a line."""
    records = []
    for line in lines:
        tag = MPIRUN_TAG.match(line)
        if tag:
            records.append((int(tag.group(1)), tag.group(2), line[tag.end() :]))
        else:
            records.append((None, "system", line))
    return records


# -- python -m nccl ----------------------------------------------------------------------------


def test_python_m_nccl_prints_the_json_of_parse_nccl_file_and_the_text_of_the_command():
    path = log_path("44")
    result = run_nccl(str(path), "--json")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.count("\n") == 1
    assert json.loads(result.stdout) == parse_nccl_file(path).to_dict()
    command = io.StringIO()
    call_command("ncclsummary", str(path), "--json", stdout=command)
    assert result.stdout == command.getvalue()

    text = run_nccl(str(log_path("28")))
    assert text.returncode == 0 and text.stdout == format_summary_text(parse_nccl_file(log_path("28")))
    command = io.StringIO()
    call_command("ncclsummary", str(log_path("28")), stdout=command)
    assert text.stdout == command.getvalue()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "missing.log", "No such log file: {path}"),
        (lambda tmp: tmp, "{path} is a directory, not a log file"),
    ],
    ids=["missing", "directory"],
)
def test_python_m_nccl_fails_in_one_line_with_exit_code_2(tmp_path, make, message):
    path = make(tmp_path)
    result = run_nccl(str(path))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"python -m nccl: error: {message.format(path=path)}\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_python_m_nccl_fails_in_one_line_on_an_unreadable_file(tmp_path):
    path = tmp_path / "secret.log"
    path.write_text("h:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
    path.chmod(0)
    result = run_nccl(str(path), "--json")
    assert result.returncode == 2 and result.stderr == f"python -m nccl: error: Cannot read {path}: permission denied\n"


def test_nccl_imports_without_django_or_the_console():
    check = (
        "import sys, nccl, nccl.parser, nccl.diagnosis, nccl.cli; "
        "assert not any(m.startswith(('django', 'jobs', 'console')) for m in sys.modules), "
        "sorted(m for m in sys.modules if m.startswith(('django', 'jobs', 'console')))"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# -- structured records ------------------------------------------------------------------------------


def test_the_tagged_logs_are_found():
    assert {path.name[:2] for path in TAGGED_LOGS} >= {"08", "10", "20", "22", "23", "38", "59"}


@pytest.mark.parametrize("path", TAGGED_LOGS, ids=lambda p: p.name[:2])
def test_records_split_from_mpirun_tags_give_the_summary_of_the_raw_text(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    reader = NcclLogReader()
    reader.feed_records(as_records(lines))
    assert reader.line_count == len(lines)
    assert reader.summary().to_dict() == parse_nccl_file(path).to_dict()


def test_a_warning_names_the_launcher_rank_of_its_record_and_not_of_a_system_line():
    reader = NcclLogReader()
    reader.feed_record(3, "stderr", "h:1:2 [0] misc.cc:1 NCCL WARN something odd")
    reader.feed_record(5, "system", "h:1:3 [0] misc.cc:1 NCCL WARN something else")
    reader.feed_record(None, "stdout", "h:1:4 [0] misc.cc:1 NCCL WARN a third thing")
    details = reader.summary().warning_details
    assert [detail["launcher_rank"] for detail in details] == [3, None, None]
    tagged = parse_nccl_log(["[1,3]<stderr>:h:1:2 [0] misc.cc:1 NCCL WARN something odd"]).warning_details
    assert tagged[0]["launcher_rank"] == 3 and tagged[0]["host"] == details[0]["host"] == "h"


def test_a_record_keeps_its_error_text_without_a_tag():
    reader = NcclLogReader()
    reader.feed_record(1, "stderr", "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error")
    assert reader.summary().errors == ["RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error"]


# -- a reader fed as the log grows -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name[:2])
def test_a_log_fed_in_two_halves_with_a_summary_between_gives_the_summary_of_one_pass(path):
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(lines) // 2
    reader = NcclLogReader()
    for line in lines[:half]:
        reader.feed_line(line)
    first = reader.summary()
    first_data = first.to_dict()
    assert first_data == parse_nccl_log(lines[:half]).to_dict()
    reader.feed_lines(lines[half:])
    assert reader.summary().to_dict() == parse_nccl_file(path).to_dict()
    assert reader.summary().to_dict() == parse_nccl_file(path).to_dict()  # summary() changes nothing
    assert first.to_dict() == first_data  # and an earlier summary shares nothing with the reader


def test_a_reader_takes_the_same_odd_input_as_parse_nccl_log():
    lines = [b"h:1:2 [0] NCCL INFO NCCL version 2.20.3+cuda12.3 \xff", None, "x" * 100_000, "h:1:2 [0] NCCL"]
    reader = NcclLogReader()
    for line in lines:
        reader.feed_line(line)
    assert reader.summary().to_dict() == parse_nccl_log(lines).to_dict()
    text = "step 1\rh:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\r\nh:1:2 [0] NCCL INFO rank 0 nranks 4\n"
    whole = NcclLogReader()
    whole.feed_lines(text)
    assert whole.summary().to_dict() == parse_nccl_text(text).to_dict()
