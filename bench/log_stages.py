"""Each stage of a job's log path, in this process and without SSH, beside the floor it cannot beat.

bench/log_throughput.py measures the whole flow; this one says where a line's CPU time goes in the
console's Python, stage by stage, on the same lines (mpirun's tagged output, as the flood job prints):

- split: mpirun's tagged output into each rank's lines (jobs.runtime.mpirun_output), beside `str.split`
  of the same text (reading the lines at all);
- store: the lines stored in batches of LOG_FLUSH_MAX_LINES, as the run stores them (jobs.logs.store:
  the job row locked, the cap counted, the cursor kept), beside the same rows inserted by the sqlite3
  module alone (multi-row INSERTs, one commit a batch);
- monitor: the run's monitor reading every stored line back (jobs.logs.store.lines_after) and
  looking for metrics in it, beside a bare SELECT of the same columns;
- live follower: the event stream's pages as it reads and writes them (jobs.logs.follow), beside the same
  bare SELECT.

Each figure is CPU time (this process's), the best of --repeat runs; a SQLite database of its own.

    .venv/bin/python bench/log_stages.py [--lines 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sqlite3
import time

import benchkit

LINE = "[1,{rank}]<stdout>:FLOOD {rank} {number:07d} 1764590000.000000 step={number} loss=0.{number:04d} " + "x" * 24
CHUNK = 32768  # about what one read of an SSH channel gives


def best(repeat: int, work) -> float:
    """The least CPU time of `repeat` runs of work() (each run gets a fresh start from work's own set-up)."""
    times = []
    for _ in range(repeat):
        prepare = work()
        started = time.process_time()
        prepare()
        times.append(time.process_time() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = benchkit.begin("log_stages", parser, 590)
    _scratch, new_job = benchkit.in_process_console("log-stages-")
    from django.conf import settings
    from django.db import connection

    from jobs.logs.follow import EVENT_BATCH_LINES, _next_batch
    from jobs.logs.store import lines_after, store_lines
    from jobs.models import TrainingJob
    from jobs.results.metrics import MetricExtractor, default_metric_definitions
    from jobs.runtime.mpirun_output import MpirunOutput

    text = "".join(LINE.format(rank=number % 4, number=number) + "\n" for number in range(args.lines))
    chunks = [text[start:start + CHUNK] for start in range(0, len(text), CHUNK)]
    workers = (0, 0, 1, 1)
    records = [record for chunk in chunks for record in MpirunOutput("stdout", workers, 1 << 20).feed(chunk)]
    assert len(records) == args.lines
    batch = settings.LOG_FLUSH_MAX_LINES
    rows: dict[str, tuple[float, float]] = {}

    def split():
        output = MpirunOutput("stdout", workers, settings.LOG_LINE_MAX_BYTES)
        return lambda: [output.feed(chunk) for chunk in chunks]

    def bare_split():
        return lambda: [chunk.split("\n") for chunk in chunks]

    rows["split mpirun's output into ranks' lines"] = (best(args.repeat, split), best(args.repeat, bare_split))

    def store():
        job_id = new_job()
        return lambda: [store_lines(job_id, records[start:start + batch], launch_cursor={"stdout": {"offset": start}})
                        for start in range(0, len(records), batch)]

    database = settings.DATABASES["default"]["NAME"]
    bare = sqlite3.connect(database, isolation_level=None)
    # The floor's table is the log's own, with the same indexes: the same work for the database.
    table_sql, = bare.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs_logline'").fetchone()
    bare.execute(table_sql.replace('"jobs_logline"', '"bare_lines"', 1))
    for (index_sql,) in bare.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs_logline' "
                                     "AND sql IS NOT NULL").fetchall():
        bare.execute(index_sql.replace('"jobs_logline"', '"bare_lines"').replace('INDEX "', 'INDEX "bare_'))

    def bare_store():
        bare.execute("DELETE FROM bare_lines")
        at = "2026-12-01 00:00:00.000000"
        values = [value for number, record in enumerate(records)
                  for value in (1, number + 1, record.worker_index, record.rank, record.stream, record.text, at)]
        # The best the driver does: multi-row INSERTs of as many rows as Django lets SQLite take parameters for.
        per_statement = connection.features.max_query_params // 7
        batches = [[(first, min(per_statement, start + batch - first, len(records) - first))
                    for first in range(start, min(start + batch, len(records)), per_statement)]
                   for start in range(0, len(records), batch)]
        statements = {count: "INSERT INTO bare_lines (job_id, seq, worker_index, rank, stream, text, at) VALUES "
                             + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * count)
                      for pieces in batches for _first, count in pieces}

        def insert():
            for pieces in batches:
                bare.execute("BEGIN")
                for first, count in pieces:
                    bare.execute(statements[count], values[first * 7:(first + count) * 7])
                bare.execute("COMMIT")
        return insert

    rows[f"store, {batch} lines a batch"] = (best(args.repeat, store), best(args.repeat, bare_store))

    stored = TrainingJob.objects.filter(log_line_count=args.lines).values_list("pk", flat=True).first()
    extractor = MetricExtractor(default_metric_definitions())

    def monitor():
        def read():
            for start in range(0, args.lines, 10_000):
                extractor.extract_many([line.text for line in lines_after(stored, start, 10_000)])
        return read

    def bare_select(page: int):
        def prepare():
            cursor = bare.cursor()

            def read():
                for start in range(0, args.lines, page):
                    cursor.execute("SELECT seq, worker_index, rank, stream, text, at FROM jobs_logline WHERE job_id = ? "
                                   "AND seq > ? ORDER BY seq LIMIT ?", (stored, start, page)).fetchall()
            return read
        return prepare

    rows["monitor: read back, metrics looked for"] = (best(args.repeat, monitor), best(args.repeat, bare_select(10_000)))

    status = TrainingJob.objects.values_list("status", flat=True).get(pk=stored)

    def follower():
        def send():
            cursor = 0
            while cursor < args.lines:  # each page as the event stream reads and writes it (the job's row too)
                cursor = _next_batch(stored, cursor, {}, status).cursor
        return send

    rows["live follower: event stream pages"] = (best(args.repeat, follower),
                                                  best(args.repeat, bare_select(EVENT_BATCH_LINES)))
    bare.close()
    connection.close()

    table = [[stage, f"{args.lines / console:,.0f}", f"{args.lines / floor:,.0f}", f"{console / floor:.1f}",
              f"{console / args.lines * 1e6:.1f}"] for stage, (console, floor) in rows.items()]
    print(f"\n{args.lines:,} lines of mpirun's tagged output ({len(text) / 1e6:.0f} MB); CPU time, best of "
          f"{args.repeat}; SQLite; {benchkit.load_line()} at the end")
    print(benchkit.table(["stage", "console lines/s", "floor lines/s", "console / floor (time)", "console µs a line"],
                         table))
    print("floors: str.split of the same text; the same rows by the sqlite3 module alone; a bare SELECT of the "
          "same columns and pages")


if __name__ == "__main__":
    main()
