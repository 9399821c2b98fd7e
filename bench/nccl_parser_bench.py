#!/usr/bin/env python
"""Throughput and memory of nccl.parser on a large synthetic NCCL log.

The log is built from the real excerpts in tests/data/nccl-logs: each block
copies every real line with its host and pid moved to another node, and
interleaves training output (loss lines, progress bars ending in \\r, Python
logging, tracebacks).  It is written to a temporary file and parsed from disk
line by line, the way `manage.py ncclsummary` reads a log, so the memory
figure is the parser's own state, not the input.  Its floor is timed in the
same run over the same file: `grep -c NCCL` (LC_ALL=C), one pass that only
finds the lines a parser would have to look at.

    .venv/bin/python bench/nccl_parser_bench.py [--size-mb 64] [--nodes 64] [--no-trace] [--nccl-only]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nccl.parser import parse_nccl_file  # noqa: E402
from nccl.patterns import HEADER  # noqa: E402

LOG_DIR = ROOT / "tests" / "data" / "nccl-logs"


def real_lines() -> list[str]:
    return [line for path in sorted(LOG_DIR.glob("*.log")) for line in path.read_text(encoding="utf-8").splitlines()]


def on_node(line: str, node: int) -> str:
    """The same line as printed by a process on another node."""
    match = HEADER.search(line)
    if match is None:
        return line
    start = match.start()
    cut = max(line.rfind(" ", 0, start), line.rfind(":", 0, start)) + 1
    pid = int(match.group(1)) + node
    return f"{line[:cut]}{line[cut:start]}-n{node:03d}:{pid}{line[match.start(2) - 1 :]}"


def program_output(rng: random.Random, step: int) -> str:
    kind = rng.random()
    if kind < 0.45:
        speed = rng.uniform(900, 1300)
        return (
            f"Epoch {step // 1000} | step {step} | loss {rng.uniform(1, 3):.4f} | lr 3.0e-04 | {speed:.1f} samples/s\n"
        )
    if kind < 0.65:
        done = step % 1000
        return f" {done // 10:3d}%|{'#' * (done // 100):<10}| {done}/1000 [00:{done % 60:02d}<01:30,  9.72it/s]\r"
    if kind < 0.85:
        size = rng.randint(1, 9)
        return f"2025-11-12 20:41:{step % 60:02d},851 - INFO - saved checkpoint /ckpt/step_{step}.pt ({size}.2 GB)\n"
    return '  File "/usr/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1501, in _call_impl\n'


def write_log(path: Path, size_bytes: int, nodes: int, seed: int, most_program_lines: int = 3) -> None:
    rng = random.Random(seed)
    templates = real_lines()
    written, block, step = 0, 0, 0
    with open(path, "w", encoding="utf-8") as out:
        while written < size_bytes:
            node = block % nodes
            chunk = []
            for line in templates:
                chunk.append(on_node(line, node) + "\n")
                for _ in range(rng.randint(0, most_program_lines)):
                    chunk.append(program_output(rng, step))
                    step += 1
            text = "".join(chunk)
            out.write(text)
            written += len(text.encode("utf-8"))
            block += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=64.0, help="size of the synthetic log (default 64)")
    parser.add_argument("--nodes", type=int, default=64, help="number of nodes the lines are spread over")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-trace", action="store_true", help="skip the tracemalloc pass (it runs ~3x slower)")
    parser.add_argument(
        "--nccl-only", action="store_true", help="no interleaved program output: the worst case, every line is NCCL's"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic-nccl.log"
        started = time.perf_counter()
        write_log(path, int(args.size_mb * 1e6), args.nodes, args.seed, 0 if args.nccl_only else 3)
        size = os.path.getsize(path)
        print(f"built {size / 1e6:.1f} MB synthetic log in {time.perf_counter() - started:.1f} s", flush=True)

        started = time.perf_counter()
        summary = parse_nccl_file(path)
        elapsed = time.perf_counter() - started
        print(
            f"parsed: {summary.nccl_line_count:,} NCCL lines of {summary.line_count:,}; {len(summary.hosts)} hosts, "
            f"net {summary.net}, {len(summary.warnings) + summary.warnings_omitted:,} warnings, "
            f"{summary.unparsed['count']:,} unparsed",
            flush=True,
        )

        # The floor: one pass over the same file (in the page cache, as it is for the parser) finding NCCL's lines.
        started = time.perf_counter()
        grep = subprocess.run(["grep", "-c", "NCCL", str(path)], capture_output=True, text=True,
                              env={**os.environ, "LC_ALL": "C"}, check=True)
        grep_elapsed = time.perf_counter() - started
        grep_lines = int(grep.stdout.strip())

        peak = None
        if not args.no_trace:
            tracemalloc.start()
            parse_nccl_file(path)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    max_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    traced = f"parser peak {peak / 2**20:.1f} MiB (tracemalloc), " if peak is not None else ""
    print(
        f"RESULT nccl_parser: {size / 1e6:.1f} MB, {summary.line_count:,} lines in {elapsed:.2f} s = "
        f"{size / 1e6 / elapsed:.1f} MB/s, {summary.line_count / elapsed:,.0f} lines/s; "
        f"{traced}process max RSS {max_rss_mib:.0f} MiB"
    )
    parser_rate, grep_rate = size / 1e6 / elapsed, size / 1e6 / grep_elapsed
    rows = [
        ("nccl.parser (parse_nccl_file)", elapsed, parser_rate, f"{summary.nccl_line_count:,} NCCL lines"),
        ("floor: grep -c NCCL (LC_ALL=C)", grep_elapsed, grep_rate, f"{grep_lines:,} lines hold NCCL"),
    ]
    print(f"\n| same {size / 1e6:.1f} MB file | seconds | MB/s | |\n|---|---:|---:|---|")
    for name, seconds, rate, note in rows:
        print(f"| {name} | {seconds:.2f} | {rate:.1f} | {note} |")
    print(f"RESULT ratio: the floor is {grep_rate / parser_rate:.0f}x the parser's MB/s "
          f"(parser at {100 * parser_rate / grep_rate:.1f}% of grep's)")

if __name__ == "__main__":
    main()
