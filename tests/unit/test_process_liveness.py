"""Beat and the Celery workers judged hung from when each last gave a sign of life (console.liveness), on a clock
of the test's own; and what the capacity page and the node admin say of them."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.liveness import STARTING_SECONDS, Verdict, Watched, heartbeat_seconds, hung, is_stale
from jobs.models import ConsoleProcess
from tests.fixtures import person

LIMIT = 60.0
T0 = 1_000_000.0  # when the console started its processes
UP = T0 + STARTING_SECONDS  # by then each has given a first sign


def judged(now, beat_seen, runs_seen=None, control_seen=None, backlog=0, broker_since=T0, started=T0):
    """What the watch decides at `now`, every sign given at the times named (the workers' signs default to now)."""
    workers = [Watched("worker-runs", started, now if runs_seen is None else runs_seen),
               Watched("worker-control", started, now if control_seen is None else control_seen)]
    return hung(now, LIMIT, broker_since, Watched("beat", started, beat_seen), workers,
                beat_carrier="worker-control", carrier_backlog=backlog)


def test_processes_that_gave_a_sign_within_the_limit_are_left_alone():
    assert judged(UP + 100, beat_seen=UP + 100 - LIMIT) == []


def test_a_beat_silent_past_the_limit_is_hung_while_its_carrier_answers_and_no_heartbeat_waits():
    assert judged(UP + 100, beat_seen=UP + 30) == [Verdict("beat", 70.0)]


def test_a_worker_that_answers_no_ping_past_the_limit_is_hung():
    assert judged(UP + 100, beat_seen=UP + 100, runs_seen=UP + 39) == [Verdict("worker-runs", 61.0)]


def test_a_silent_control_worker_is_blamed_instead_of_beat_whose_heartbeat_it_runs():
    assert judged(UP + 100, beat_seen=UP + 10, control_seen=UP + 10) == [Verdict("worker-control", 90.0)]


def test_beat_is_not_blamed_while_heartbeats_wait_in_its_carriers_queue():
    assert judged(UP + 100, beat_seen=UP + 10, backlog=3) == []


def test_a_process_just_started_has_its_start_before_its_silence_counts():
    started = UP + 500
    assert judged(started + STARTING_SECONDS + LIMIT, beat_seen=UP, runs_seen=UP, started=started) == []
    assert judged(started + STARTING_SECONDS + LIMIT + 1, beat_seen=UP, runs_seen=UP, started=started) == [
        Verdict("worker-runs", LIMIT + 1), Verdict("beat", LIMIT + 1)]


def test_beat_is_blamed_only_for_its_silence_since_its_carrier_came_back():
    control = Watched("worker-control", started_at=UP + 200, seen_at=UP + 250)  # restarted, answering again
    beat = Watched("beat", T0, seen_at=UP + 150)  # its last tick run before the control worker hung
    assert hung(UP + 259, LIMIT, T0, beat, [control], "worker-control", 0) == []
    assert hung(UP + 265, LIMIT, T0, beat, [control], "worker-control", 0) == [Verdict("beat", 65.0)]


def test_nothing_is_judged_while_the_broker_is_away_nor_for_its_absence_once_it_is_back():
    assert judged(UP + 500, beat_seen=UP, runs_seen=UP, control_seen=UP, broker_since=None) == []
    assert judged(UP + 500, beat_seen=UP, runs_seen=UP, broker_since=UP + 450) == []
    assert judged(UP + 511, beat_seen=UP, runs_seen=UP, broker_since=UP + 450) == [
        Verdict("worker-runs", 61.0), Verdict("beat", 61.0)]


def test_beat_ticks_a_few_times_within_the_limit_never_less_often_than_every_ten_seconds():
    assert heartbeat_seconds(60) == 10
    assert heartbeat_seconds(20) == 5
    assert heartbeat_seconds(4) == 1
    assert heartbeat_seconds(600) == 10


def test_a_process_never_seen_or_seen_longer_ago_than_the_limit_is_shown_stale():
    assert is_stale(T0, None, LIMIT)
    assert is_stale(T0, T0 - LIMIT - 1, LIMIT)
    assert not is_stale(T0, T0 - LIMIT, LIMIT)


@pytest.mark.django_db
def test_the_capacity_page_says_when_the_scheduler_was_last_seen_and_warns_when_it_is_silent():
    client = Client()
    client.force_login(person("capacity-reader"))
    now = timezone.now()
    ConsoleProcess.seen(ConsoleProcess.Role.BEAT, now - timedelta(seconds=12))

    page = client.get("/capacity").content.decode()
    assert "last seen 12 s ago" in page and "data-stale" not in page

    ConsoleProcess.seen(ConsoleProcess.Role.BEAT, now - timedelta(seconds=95))
    ConsoleProcess.restarted(ConsoleProcess.Role.BEAT, now, 63.4)
    page = client.get("/capacity").content.decode()
    assert "last seen 95 s ago" in page and "data-stale" in page and "silent for more than 60 s" in page
    assert "killed after 63 s of silence (1 restart in all)" in page


@pytest.mark.django_db
def test_a_console_whose_beat_never_ticked_says_the_scheduler_was_never_seen_in_the_node_admin():
    client = Client()
    client.force_login(person("root-admin", is_staff=True, is_superuser=True))

    page = client.get("/admin/jobs/node/").content.decode()

    assert "Scheduler (Celery beat)" in page and "never seen" in page and "data-stale" in page
