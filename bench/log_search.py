"""Searching a whole log, as the job page's search does it, beside the database's own time for the same question.

A log of --lines lines (200,000 by default: a flood's worth, as a user reported searching one), one job in a
SQLite database of its own, one line that looks like an error near its start and a rare text near its
end. Timed, wall clock, best of --repeat:

- a text near the start, the search's first page (jobs.logs.search.search_before, read back stretch after
  stretch of SCAN_WINDOW lines), beside one bare SELECT ... LIKE ... ORDER BY seq DESC LIMIT 500;
- the matches of a text counted (one COUNT in the database), beside the same COUNT by the sqlite3 module;
- the lines that look like errors counted, and those of an RE2 pattern (checked line by line in Python),
  beside a bare SELECT of every line's text (reading the log once: what a line-by-line check cannot beat).

The page asks again while a search or count says where it stopped (each answer looks for SEARCH_SECONDS);
the last column says how many answers that takes.

    .venv/bin/python bench/log_search.py [--lines 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import sqlite3

import benchkit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = benchkit.begin("log_search", parser, 590)
    _scratch, new_job = benchkit.in_process_console("log-search-")
    from django.conf import settings
    from django.db import connection

    from jobs.logs.search import SEARCH_SECONDS, count_matches, search_before
    from jobs.logs.store import LogRecord, store_lines

    job_id = new_job(log_cap_bytes=0)
    texts = [f"step {number} loss=0.{number % 9973:04d} lr=0.001 samples/s=1234.5" for number in range(args.lines)]
    texts[args.lines // 3] = "RuntimeError: the loader lost shard 7"
    texts[args.lines - args.lines // 10] = "checkpoint needle written"
    batch = settings.LOG_FLUSH_MAX_LINES
    for start in range(0, args.lines, batch):
        store_lines(job_id, [LogRecord(text=text, rank=number % 4, worker_index=number % 4 // 2)
                             for number, text in enumerate(texts[start:start + batch], start)])
    total = args.lines
    bare = sqlite3.connect(settings.DATABASES["default"]["NAME"])

    def bare_rows(sql: str, *parameters) -> list:
        return bare.execute(sql, (job_id, *parameters)).fetchall()

    rows = []

    def measure(what: str, console, floor, answers) -> None:
        took, floor_took = benchkit.best_wall_time(args.repeat, console), benchkit.best_wall_time(args.repeat, floor)
        rows.append([what, f"{took * 1000:,.0f}", f"{floor_took * 1000:,.0f}", f"{took / floor_took:.1f}",
                     str(answers(took))])

    forever = 1e9
    near_start = {"q": "lost shard"}
    found = search_before(job_id, total + 1, near_start, 500, total=total, seconds=forever)
    assert [line.text for line in found.lines] == [texts[args.lines // 3]] and found.previous is None
    measure("a text near the start: the first page of matches", lambda: search_before(
                job_id, total + 1, near_start, 500, total=total, seconds=forever),
            lambda: bare_rows("SELECT seq, worker_index, rank, stream, text, at FROM jobs_logline WHERE job_id = ? "
                              "AND text LIKE '%lost shard%' ORDER BY seq DESC LIMIT 500"),
            lambda took: max(1, math.ceil(took / SEARCH_SECONDS)))

    counts = [
        ("a text's matches counted", {"q": "needle"}, 1,
         lambda: bare_rows("SELECT count(*) FROM jobs_logline WHERE job_id = ? AND text LIKE '%needle%'")),
        ("the lines that look like errors counted", {"level": "error"}, 1,
         lambda: bare_rows("SELECT text FROM jobs_logline WHERE job_id = ?")),
        ("an RE2 pattern's matches counted", {"q": r"loss=0\.99\d\d ", "regex": True}, None,
         lambda: bare_rows("SELECT text FROM jobs_logline WHERE job_id = ?")),
    ]
    for what, query, expected, floor in counts:
        answer = count_matches(job_id, query, after=0, through=total, seconds=forever)
        assert answer.next is None and (expected is None or answer.count == expected), (what, answer)
        measure(what, lambda query=query: count_matches(job_id, query, after=0, through=total, seconds=forever),
                floor, lambda took: max(1, math.ceil(took / SEARCH_SECONDS)))
    bare.close()
    connection.close()

    print(f"\n{args.lines:,} lines in one job's log; wall time, best of {args.repeat}; SQLite; "
          f"{benchkit.load_line()} at the end")
    print(benchkit.table(["search", "console ms", "floor ms", "console / floor", "page's answers"], rows))
    print("floors: the same question in one statement by the sqlite3 module (a text), or every line's text read "
          "once by it (a level, a pattern: each line checked in Python)")


if __name__ == "__main__":
    main()
