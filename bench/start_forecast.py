"""The start forecast of waiting jobs (jobs.start_forecast) on a long queue, beside reading the same rows.

A console of --nodes nodes (one spec, no pool), all held by running jobs of 1-4 nodes with auto stops of
1-24 h, and --waiting jobs waiting behind them (1-4 nodes each, half of them with an auto stop), in a SQLite
database of its own. Timed, wall clock, best of --repeat:

- what a waiting job's page does on each refresh: the queue read (waiting_forecast.queue_state) and the
  forecast of the last job in the queue (its range and every alternative, each proven by a dry run);
- the same for the first job in the queue;
- the capacity page's forecasts: one per waiting job it lists;

beside the floor: the three reads the forecast needs (nodes, their holders, the waiting jobs) by the sqlite3
module alone.

    .venv/bin/python bench/start_forecast.py [--nodes 200] [--waiting 500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
from datetime import timedelta

import benchkit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--waiting", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = benchkit.begin("start_forecast", parser, 590)
    _scratch, new_job = benchkit.in_process_console("start-forecast-")
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from jobs.models import JobStatus, Node, ResourceSpec, TrainingJob
    from jobs.pages.capacity_detail import pool_detail
    from jobs.pages.waiting_forecast import job_forecast, queue_state

    settings.RUN_SLOTS = 10**6
    chance = random.Random(7)
    spec = ResourceSpec.objects.get(name="bench")
    now = timezone.now()
    nodes = Node.objects.bulk_create([Node(name=f"node-{index:04d}", address="10.0.0.1", spec=spec)
                                      for index in range(args.nodes)])
    index = 0
    while index < len(nodes):
        size = min(chance.randint(1, 4), len(nodes) - index)
        holder = new_job(status=JobStatus.RUNNING, started_at=now - timedelta(minutes=30),
                         auto_stop_hours=chance.randint(1, 24))
        TrainingJob.objects.filter(pk=holder).update(node_count=size)
        Node.objects.filter(pk__in=[node.pk for node in nodes[index:index + size]]).update(allocated_to_id=holder)
        index += size
    for number in range(args.waiting):
        waiting = new_job(status=JobStatus.PENDING, auto_stop_hours=chance.randint(1, 12) if number % 2 else None,
                          created_at=now + timedelta(seconds=number))
        TrainingJob.objects.filter(pk=waiting).update(node_count=chance.randint(1, 4))
    queue = list(TrainingJob.objects.filter(status=JobStatus.PENDING).order_by("created_at", "id"))
    first, last = queue[0], queue[-1]
    assert job_forecast(last) is not None and job_forecast(first) is not None
    bare = sqlite3.connect(settings.DATABASES["default"]["NAME"])

    def floor() -> None:
        bare.execute("SELECT id, name, spec_id, pool_id, enabled, draining, state, allocated_to_id FROM jobs_node").fetchall()
        bare.execute("SELECT id, started_at, auto_stop_hours FROM jobs_trainingjob WHERE id IN "
                     "(SELECT allocated_to_id FROM jobs_node WHERE allocated_to_id IS NOT NULL)").fetchall()
        bare.execute("SELECT id, spec_id, pool_id, node_count, auto_stop_hours FROM jobs_trainingjob WHERE status = ? "
                     "ORDER BY created_at, id", (JobStatus.PENDING,)).fetchall()

    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("bench-admin")

    def capacity_page() -> None:
        detail = pool_detail(admin, None)
        assert detail is not None

    rows = []
    floor_took = benchkit.best_wall_time(args.repeat, floor)
    for what, work in (("the last waiting job's page refresh", lambda: job_forecast(last)),
                       ("the first waiting job's page refresh", lambda: job_forecast(first)),
                       ("the capacity page's waiting jobs", capacity_page)):
        took = benchkit.best_wall_time(args.repeat, work)
        rows.append([what, f"{took * 1000:,.0f}", f"{floor_took * 1000:,.1f}", f"{took / floor_took:,.0f}"])
    bare.close()
    connection.close()
    state = queue_state()
    print(f"\n{args.nodes:,} nodes all held, {args.waiting:,} jobs waiting ({len(state.queue):,} in the queue read); "
          f"wall time, best of {args.repeat}; SQLite; {benchkit.load_line()} at the end")
    print(benchkit.table(["forecast", "console ms", "floor ms", "console / floor"], rows))
    print("floor: the nodes, their holders and the waiting jobs read once by the sqlite3 module (what any forecast "
          "must read)")


if __name__ == "__main__":
    main()
