"""How the console's pages and API hold up with a large record: 100,000 jobs and a 10-million-line log in PostgreSQL.

Creates a PostgreSQL database of its own (bench_scale on 127.0.0.1:5432, user postgres, unless
--server names another), migrates it, seeds it, and bulk-loads the rows with COPY (jobs,
one worker and two events a job, and one job's log of 10,000,000 lines); then times each page and API
read: in process (Django's test client: the time in the view, middleware and template, with the queries
each makes counted) and over HTTP against uvicorn (a keep-alive client, as a browser or script reads
it). Each query a page made is run under EXPLAIN, and a sequential scan of a large table is named. The
database is dropped at the end, also after a failure.

    .venv/bin/python bench/record_scale.py [--jobs 100000] [--log-lines 10000000] [--requests 20]
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import statistics
import time
from datetime import UTC, datetime, timedelta

import benchkit

SERVER = "postgresql://postgres@127.0.0.1:5432"
NAME = "bench_scale"
VAR = benchkit.BASE_DIR / "var" / "bench-scale"
LARGE_TABLES = ("jobs_trainingjob", "jobs_logline", "jobs_worker", "jobs_jobevent")


def admin_sql(server: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        connection.execute(statement)


def copy_rows(cursor, table: str, columns: list[str], rows) -> None:
    with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def template_row(cursor, table: str, pk: int) -> tuple[list[str], list]:
    """A row's columns (all but id) and values, as PostgreSQL's text: what COPY's text format reads back."""
    cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s AND column_name <> 'id' "
                   "ORDER BY ordinal_position", [table])
    columns = [name for (name,) in cursor.fetchall()]
    cursor.execute(f"SELECT {', '.join(f'{name}::text' for name in columns)} FROM {table} WHERE id = %s", [pk])
    return columns, list(cursor.fetchone())


def clones(columns: list[str], values: list, count: int, change):
    """`count` copies of a row, each with the columns `change(i)` gives it."""
    where = {name: index for index, name in enumerate(columns)}
    for i in range(count):
        row = list(values)
        for name, value in change(i).items():
            row[where[name]] = value
        yield row


def load(jobs: int, log_lines: int) -> dict:
    """The record: `jobs` jobs of several owners and states, and one large job with `log_lines` lines."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from jobs.models import CodeDirectory, EngineVersion, JobEvent, JobStatus, ResourceSpec, TrainingJob, Worker

    users = get_user_model()
    admin = users.objects.get(username="admin")
    people = [users.objects.create_user(f"user{index}", password="bench") for index in range(10)]
    now = datetime.now(UTC)
    big = TrainingJob.objects.create(
        name="big-log", owner=people[0], engine_version=EngineVersion.objects.first(),
        code_dir=CodeDirectory.objects.create(name="train", path=str(VAR / "code"), sharing="everyone"),
        boot_file="train.py", spec=ResourceSpec.objects.create(name="cpu-4", cpu_cores=4, memory_gb=8), node_count=4,
        bind_args="", x_args="", mca_args="", tune_prefixes="", status=JobStatus.COMPLETED, exit_code=0,
        command="mpirun -np 16 python train.py", created_at=now - timedelta(hours=3),
        started_at=now - timedelta(hours=3), ended_at=now - timedelta(hours=1), log_line_count=log_lines)
    workers = [Worker.objects.create(job=big, index=index, node_name=f"node-{index}", address=f"10.9.0.{index + 1}",
                                     hostname=f"big-log-worker-{index}", state="Removed") for index in range(4)]
    JobEvent.objects.create(job=big, kind="state:Running", message="Running")
    timings = {}
    statuses = ["Completed"] * 14 + ["Failed"] * 4 + ["Terminated", "Abnormal"]
    with connection.connection.cursor() as cursor:
        started = time.monotonic()
        columns, values = template_row(cursor, "jobs_trainingjob", big.pk)
        owners = [admin.pk, *(person.pk for person in people)]

        def job_change(i: int) -> dict:
            created = now - timedelta(hours=4, seconds=60 * i)
            return {"name": f"job-{i:06d}", "owner_id": owners[i % len(owners)], "status": statuses[i % len(statuses)],
                    "created_at": created.isoformat(), "started_at": (created + timedelta(seconds=20)).isoformat(),
                    "ended_at": (created + timedelta(seconds=600)).isoformat(), "log_line_count": "40",
                    "node_count": "1", "exit_code": "0" if statuses[i % len(statuses)] == "Completed" else "1"}

        copy_rows(cursor, "jobs_trainingjob", columns, clones(columns, values, jobs - 1, job_change))
        cursor.execute("SELECT id FROM jobs_trainingjob WHERE id <> %s", [big.pk])
        ids = [pk for (pk,) in cursor.fetchall()]
        w_columns, w_values = template_row(cursor, "jobs_worker", workers[0].pk)
        copy_rows(cursor, "jobs_worker", w_columns, clones(w_columns, w_values, len(ids), lambda i: {
            "job_id": str(ids[i]), "index": "0", "node_name": f"node-{i % 16}", "hostname": f"job-{i}-worker-0"}))
        e_columns, e_values = template_row(cursor, "jobs_jobevent", JobEvent.objects.get(job=big).pk)
        copy_rows(cursor, "jobs_jobevent", e_columns, clones(e_columns, e_values, 2 * len(ids), lambda i: {
            "job_id": str(ids[i // 2]), "kind": "state:Running" if i % 2 == 0 else "state:Completed"}))
        timings["jobs"] = time.monotonic() - started

        started = time.monotonic()
        base = now - timedelta(hours=3)
        # Text chunks, not a row object per line: the generator, not PostgreSQL, would bound the load.
        with cursor.copy("COPY jobs_logline (job_id, seq, worker_index, rank, stream, text, at) FROM STDIN") as copy:
            chunk = 50_000
            for start in range(1, log_lines + 1, chunk):
                at = (base + timedelta(seconds=start // 1000)).isoformat()
                copy.write("".join(
                    f"{big.pk}\t{seq}\t{seq % 4 // 2}\t{seq % 4}\tstdout\tstep {seq:08d} loss {seq % 9973 / 9973:.4f} "
                    f"lr 3.0e-04 tokens/s 51234.5 grad_norm 1.02\t{at}\n"
                    for seq in range(start, min(start + chunk, log_lines + 1))))
        timings["log"] = time.monotonic() - started
        started = time.monotonic()
        cursor.execute("ANALYZE")
        timings["analyze"] = time.monotonic() - started
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('jobs_logline')), "
                       "pg_size_pretty(pg_total_relation_size('jobs_trainingjob'))")
        timings["sizes"] = cursor.fetchone()
    return {"big": big, "owner": people[0], "admin": admin, "timings": timings}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


SEQ_SCAN = re.compile(r"Seq Scan on (\w+)")


SELECT_LIST = re.compile(r"^SELECT (?!COUNT).*? FROM ", re.S)


def short(sql: str) -> str:
    return SELECT_LIST.sub("SELECT ... FROM ", sql)


def explain(sql: str, analyze: bool = False) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(("EXPLAIN ANALYZE " if analyze else "EXPLAIN ") + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def seq_scans(sql: str) -> list[str]:
    """The large tables a query reads by a sequential scan, from its plan; "(count)" when it only counts rows."""
    if not sql.lstrip().upper().startswith("SELECT"):
        return []
    counting = sql.lstrip().upper().startswith("SELECT COUNT(")
    return [f"{table} (count)" if counting else table
            for table in sorted({table for table in SEQ_SCAN.findall(explain(sql)) if table in LARGE_TABLES})]


def in_process(client, path: str, requests: int, headers: dict) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(path, **headers)  # once first: a token's first use of the interval writes its last_used_at
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, **headers)
    # Read now: the next request's start clears the connection's log that captured_queries is a view of.
    queries = list(captured.captured_queries)
    assert response.status_code == 200, (path, response.status_code)
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(path, **headers)
        if hasattr(response, "streaming_content"):
            b"".join(response.streaming_content)
        times.append(time.perf_counter() - started)
    scans = sorted({table for query in queries for table in seq_scans(query["sql"])})
    slowest = max(queries, key=lambda query: float(query["time"]))
    return {"times": times, "queries": len(queries), "scans": scans, "alone": queries_alone(queries, requests),
            "slowest": (float(slowest["time"]), slowest["sql"]), "bytes": len(response.content)}


def queries_alone(queries: list[dict], requests: int) -> list[float]:
    """The floor of a page: its SELECTs run again as they were sent, on the same connection, with nothing else."""
    from django.db import connection

    selects = [query["sql"] for query in queries if query["sql"].lstrip().upper().startswith("SELECT")]
    times = []
    with connection.cursor() as cursor:
        for _ in range(requests):
            started = time.perf_counter()
            for sql in selects:
                cursor.execute(sql)
                cursor.fetchall()
            times.append(time.perf_counter() - started)
    return times


def timed(read, requests: int) -> list[float]:
    read()
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        read()
        times.append(time.perf_counter() - started)
    return times


def over_http(port: int, path: str, requests: int, headers: dict) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    times = []
    for index in range(requests + 1):
        started = time.perf_counter()
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        response.read()
        assert response.status == 200, (path, response.status)
        if index:  # the first opens the connection and warms the process's caches
            times.append(time.perf_counter() - started)
    connection.close()
    return times


def deep_page(requests: int) -> None:
    """Rows 80,001-80,020 of the list, read as the list reads them (ids first) and by a plain OFFSET."""
    from django.contrib.auth import get_user_model

    from jobs.pages.paging import IdsFirst
    from jobs.submission.access import visible_jobs

    jobs = visible_jobs(get_user_model().objects.get(username="admin")).order_by("-created_at", "-id")
    plain = timed(lambda: list(jobs[80000:80020]), requests)
    ids_first = timed(lambda: IdsFirst(jobs)[80000:80020], requests)
    print(f"rows 80,001-80,020 with their joins, p50 of {requests}: by OFFSET {statistics.median(plain) * 1000:.1f} ms, "
          f"ids first {statistics.median(ids_first) * 1000:.1f} ms (the list's way)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--log-lines", type=int, default=10_000_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--server", default=SERVER, help="a PostgreSQL server's URL, without a database name")
    args = benchkit.begin("record_scale", parser, 570)

    from console import services

    database_url = f"{args.server}/{NAME}"
    VAR.mkdir(parents=True, exist_ok=True)
    redis_port = services.free_port()
    os.environ.update(DJANGO_SETTINGS_MODULE="console.settings", CONSOLE_VAR_DIR=str(VAR), DATABASE_URL=database_url,
                      REDIS_URL=f"redis://127.0.0.1:{redis_port}/0", CELERY_BROKER_URL=f"redis://127.0.0.1:{redis_port}/0",
                      LOG_LEVEL="WARNING")
    admin_sql(args.server, f"DROP DATABASE IF EXISTS {NAME} WITH (FORCE)")
    admin_sql(args.server, f"CREATE DATABASE {NAME}")
    redis = web = None
    try:
        redis = services.start_redis(redis_port, VAR / "redis.log")
        import django

        from console.state import prepare

        prepare()  # var/, the secret key, the SQLite files: before the settings are read
        django.setup()
        from django.conf import settings
        from django.core.management import call_command
        from django.test import Client

        from jobs.models import ApiToken

        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
        call_command("migrate", verbosity=0)
        call_command("seedconsole", password="bench", stdout=open(os.devnull, "w"))
        started = time.monotonic()
        record = load(args.jobs, args.log_lines)
        t = record["timings"]
        print(f"loaded with COPY in {time.monotonic() - started:.0f} s: {args.jobs:,} jobs (with {args.jobs - 1:,} "
              f"workers and {2 * (args.jobs - 1):,} events) {t['jobs']:.1f} s; {args.log_lines:,} log lines "
              f"{t['log']:.1f} s ({args.log_lines / t['log']:,.0f} rows/s); ANALYZE {t['analyze']:.1f} s; "
              f"jobs_logline {t['sizes'][0]} with its indexes, jobs_trainingjob {t['sizes'][1]}", flush=True)

        web_port = services.free_port()
        web = services.start_web_server(web_port, {}, VAR / "uvicorn.log")  # the server production runs

        big = record["big"].pk
        viewers = {"admin": record["admin"], "user0": record["owner"]}
        tokens = {name: ApiToken.issue(user, "bench")[1] for name, user in viewers.items()}
        clients = {}
        for name, user in viewers.items():
            clients[name] = Client()
            clients[name].force_login(user)
        middle = args.log_lines // 2
        pages = [
            ("admin", "/", "job list, page 1 (all 100k jobs)"),
            ("admin", "/?page=4000", "job list, page 4000 (rows 80,001-80,020)"),
            ("admin", "/?state=Failed", "job list, Failed"),
            ("admin", "/?q=job-0777", "job list, name search"),
            ("user0", "/", "job list, one user's own (1/11 of the jobs)"),
            ("user0", "/jobs/{big}", "job page of the 10M-line job"),
            ("user0", "/jobs/{big}/live", "its live parts (the page's poller)"),
            ("user0", "/api/v1/training-jobs/{big}/log/lines?tail=1", "log pane: the tail"),
            ("user0", "/api/v1/training-jobs/{big}/log/lines?after={middle}", "log pane: after line 5M"),
            ("user0", "/api/v1/training-jobs/{big}/log/lines?before={middle}", "log pane: before line 5M"),
            ("user0", "/api/v1/training-jobs/{big}/log/lines?after={middle}&rank=3", "log pane: rank 3 after 5M"),
            ("user0", "/api/v1/training-jobs/{big}/log/lines?tail=1&q=loss%200.5000", "log pane: text search, tail"),
            ("user0", "/api/v1/training-jobs/{big}/log?offset={middle}", "API plain log after 5M"),
            ("admin", "/api/v1/training-jobs", "API job list (50)"),
            ("admin", "/api/v1/training-jobs?limit=10", "API job list (10)"),
            ("admin", "/api/v1/training-jobs?offset=90000", "API job list, offset 90,000"),
            ("admin", "/api/v1/training-jobs?status=Failed", "API job list, Failed"),
            ("user0", "/api/v1/training-jobs", "API job list, one user's own"),
            ("user0", "/api/v1/training-jobs/{big}", "API job detail"),
        ]
        rows, notes = [], []
        for viewer, template, label in pages:
            path = template.format(big=big, middle=middle)
            api = path.startswith("/api/")
            headers = {"HTTP_AUTHORIZATION": f"Token {tokens[viewer]}"} if api else {}
            found = in_process(clients[viewer], path, args.requests, headers)
            if api:
                http_headers = {"Authorization": f"Token {tokens[viewer]}"}
            else:
                http_headers = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={clients[viewer].cookies[settings.SESSION_COOKIE_NAME].value}"}
            remote = over_http(web_port, path, args.requests, http_headers)
            rows.append([label, template.format(big="BIG", middle=middle), str(found["queries"]),
                         f"{statistics.median(found['alone']) * 1000:.0f}",
                         f"{statistics.median(found['times']) * 1000:.0f} / {percentile(found['times'], 0.95) * 1000:.0f}",
                         f"{statistics.median(remote) * 1000:.0f} / {percentile(remote, 0.95) * 1000:.0f}",
                         ", ".join(found["scans"]) or "-"])
            if found["slowest"][0] > 0.04:
                plan = explain(found["slowest"][1], analyze=True).splitlines()
                notes.append(f"{label}: its slowest query, {found['slowest'][0] * 1000:.0f} ms: "
                             f"{short(found['slowest'][1])[:300]}\n    " + "\n    ".join(plan[:8]))
            print(f"  {label}: {rows[-1][4]} ms in process, {rows[-1][5]} ms over HTTP, {found['queries']} queries "
                  f"({rows[-1][3]} ms alone)",
                  flush=True)
        print(f"\n{args.jobs:,} jobs, a {args.log_lines:,}-line log (job BIG = {big}), PostgreSQL; {args.requests} "
              f"requests each, after one not counted; {benchkit.load_line()} at the end")
        print(benchkit.table(["page", "path", "queries", "its queries alone p50 ms", "in process p50 / p95 ms", "HTTP (uvicorn) p50 / p95 ms",
                              "seq scan of a large table"], rows))
        for note in notes:
            print(note)
        deep_page(args.requests)
    finally:
        services.stop(web)
        services.stop(redis)
        from django.db import connections

        connections.close_all()
        admin_sql(args.server, f"DROP DATABASE IF EXISTS {NAME} WITH (FORCE)")
        print(f"database {NAME} dropped", flush=True)


if __name__ == "__main__":
    main()
