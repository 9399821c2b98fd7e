"""`python -m nccl FILE [--json]`: the summary of an NCCL log, as text or as one JSON object.

`manage.py ncclsummary` is a thin wrapper over `summarise_file` and `render`, so both print the
same thing and fail with the same messages.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .parser import parse_nccl_file
from .summary import NcclSummary, format_summary_text

EXIT_FILE_ERROR = 2  # as argparse exits on a bad command line


class LogFileError(Exception):
    """The log file cannot be read; the message says why, in one line."""


def summarise_file(path: str | os.PathLike) -> NcclSummary:
    """Parse a log file; raises LogFileError (not an OSError and its traceback) when it cannot be read."""
    try:
        # Streams the file; bytes that are not UTF-8 are replaced, never fatal.
        return parse_nccl_file(path)
    except FileNotFoundError:
        raise LogFileError(f"No such log file: {path}") from None
    except IsADirectoryError:
        raise LogFileError(f"{path} is a directory, not a log file") from None
    except PermissionError:
        raise LogFileError(f"Cannot read {path}: permission denied") from None
    except OSError as error:  # a device or a file system that fails under the reader
        raise LogFileError(f"Cannot read {path}: {error.strerror or error}") from None


def render(summary: NcclSummary, *, as_json: bool = False) -> str:
    """The report as printed: one JSON object with sorted keys on one line, or the text report."""
    if as_json:
        return json.dumps(summary.to_dict(), sort_keys=True) + "\n"
    return format_summary_text(summary)


def build_argument_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Summarise an NCCL_DEBUG=INFO log: version, ranks, network and transports, warnings, errors.",
    )
    parser.add_argument("file", help="path of the log file to read")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m nccl") -> int:
    parser = build_argument_parser(prog)
    options = parser.parse_args(argv)
    try:
        summary = summarise_file(options.file)
    except LogFileError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return EXIT_FILE_ERROR
    try:
        sys.stdout.write(render(summary, as_json=options.json))
        sys.stdout.flush()
    except BrokenPipeError:  # `python -m nccl big.log | head`: the reader left, nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the flush at exit does not fail again
        return 1
    return 0
