"""A waiting job's start forecast as the job page, the capacity page and the API give it, and its alternatives
applied in the database: the real dispatcher starts each one."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.allocation import dispatch_pending
from jobs.allocation_rule import dry_dispatch
from jobs.models import JobStatus, Node, ResourcePool, TrainingJob
from jobs.pages.waiting_forecast import job_forecast, queue_state
from tests.fixtures import api_client, cpu_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def scripted_queue(make_job, stranger):
    """Pool a: two nodes, one held by the stranger's job until 2 h from now; pool b: two free nodes. The owner's
    job waits in pool a for both."""
    spec = cpu_spec()
    pool_a = ResourcePool.objects.create(name="a")
    pool_b = ResourcePool.objects.create(name="b")
    nodes = [Node.objects.create(name=f"{pool.name}{index}", address=f"10.8.0.{number}", spec=spec, pool=pool)
             for number, (pool, index) in enumerate([(pool_a, 0), (pool_a, 1), (pool_b, 0), (pool_b, 1)], start=1)]
    holder = make_job(owner=stranger, spec=spec, pool=pool_a, node_count=1, status=JobStatus.RUNNING,
                      auto_stop_hours=3, started_at=timezone.now() - timedelta(hours=1))
    Node.objects.filter(pk=nodes[0].pk).update(allocated_to=holder)
    waiting = make_job(spec=spec, pool=pool_a, node_count=2, name="my-waiting-run", auto_stop_hours=1)
    return holder, waiting


def test_every_alternative_applied_in_the_database_is_started_by_the_dispatcher(scripted_queue):
    _holder, waiting = scripted_queue
    forecast = job_forecast(TrainingJob.objects.get(pk=waiting.pk))
    assert forecast is not None and {alternative["kind"] for alternative in forecast["alternatives"]} == {
        "fewer_nodes", "other_pool"}
    for alternative in forecast["alternatives"]:
        with transaction.atomic():
            pool = ResourcePool.objects.filter(name=alternative["pool"]).first()
            # Submitted again: last in its queue.
            TrainingJob.objects.filter(pk=waiting.pk).update(
                node_count=alternative["node_count"], pool=pool, auto_stop_hours=alternative["auto_stop_hours"],
                created_at=timezone.now() + timedelta(hours=1))
            assert waiting.pk in dispatch_pending(), alternative["words"]
            transaction.set_rollback(True)


def test_the_estimate_is_the_holders_auto_stop_on_the_job_page_and_in_the_api(scripted_queue, owner):
    holder, waiting = scripted_queue
    forecast = job_forecast(TrainingJob.objects.get(pk=waiting.pk))
    assert forecast is not None
    end = holder.started_at + timedelta(hours=3)
    assert forecast["latest"] == end.isoformat() and forecast["earliest"] == end.isoformat()
    client = Client()
    client.force_login(owner)
    page = client.get(f"/jobs/{waiting.pk}").content.decode()
    assert 'id="start-forecast"' in page and "submitted again with 1 node, it could start now" in page
    # Said as a time of day, with its date when that is not today (near midnight it is tomorrow).
    today = timezone.localtime(end).date() == timezone.localtime().date()
    shown = timezone.localtime(end).strftime("%H:%M %Z" if today else "%Y-%m-%d %H:%M %Z")
    assert f"#{holder.pk} (1 node(s)) until about {shown}" in page
    answer = api_client(owner).get(f"/api/v1/training-jobs/{waiting.pk}/start-forecast").json()
    assert answer["waiting"] and answer["position"] == 1 and answer["scheduler"] == "console"
    assert "the pool b has 2 free nodes of this spec: submitted there, it could start now" in [
        alternative["words"] for alternative in answer["alternatives"]]
    assert "the pool b has 2 free nodes" in client.get("/capacity").content.decode()


def test_a_failed_job_held_for_debugging_frees_its_nodes_in_the_estimate_when_its_hold_ends(scripted_queue):
    holder, waiting = scripted_queue
    hold_ends = timezone.now() + timedelta(minutes=20)
    # Failed with no auto stop, its containers kept for a look inside until hold_ends.
    TrainingJob.objects.filter(pk=holder.pk).update(status=JobStatus.FAILED, auto_stop_hours=None,
                                                    held_until=hold_ends)
    forecast = job_forecast(TrainingJob.objects.get(pk=waiting.pk))
    assert forecast is not None and forecast["latest"] == hold_ends.isoformat(), forecast


def test_a_job_that_does_not_wait_has_an_empty_forecast_and_a_stranger_gets_404(scripted_queue, stranger):
    holder, waiting = scripted_queue
    answer = api_client(stranger).get(f"/api/v1/training-jobs/{holder.pk}/start-forecast").json()
    assert answer["waiting"] is False and answer["alternatives"] == []
    assert api_client(stranger).get(f"/api/v1/training-jobs/{waiting.pk}/start-forecast").status_code == 404


def test_tc_show_prints_when_a_waiting_job_may_start_and_what_would_start_it_sooner(scripted_queue, owner, capsys):
    from training_console_cli.commands import print_job

    _holder, waiting = scripted_queue
    client = api_client(owner)
    job = client.get(f"/api/v1/training-jobs/{waiting.pk}").json()
    job["start_forecast"] = client.get(f"/api/v1/training-jobs/{waiting.pk}/start-forecast").json()
    print_job(job, as_json=False)
    shown = capsys.readouterr().out
    assert " may start: by about " in shown and "    sooner: submitted again with 1 node, it could start now" in shown


def test_tc_show_prints_a_hold_and_the_slurm_job_behind_a_job(capsys):
    from training_console_cli.commands import print_job

    print_job({"id": 7, "name": "held", "status": "Failed", "held_until": "2026-12-05T20:00:00Z",
               "slurm": {"job_id": 1800123, "state": "RUNNING", "reason": "",
                         "accounting": {"account": "vision", "qos": "high"}}}, as_json=False)
    shown = capsys.readouterr().out
    assert "held until: 2026-12-05T20:00:00Z: its containers and nodes are kept for a look inside (tc shell 7)" in shown
    assert "     slurm: job 1800123, RUNNING, account vision, qos high" in shown
    print_job({"id": 8, "name": "own", "status": "Running", "held_until": None,
               "slurm": {"job_id": None, "state": "", "reason": "", "accounting": None}}, as_json=False)
    shown = capsys.readouterr().out
    assert "held until" not in shown and "slurm" not in shown


# A small cluster in the database: nodes of one spec in no pool or one of two pools, some held by running jobs
# with auto stops (or none), some disabled, draining or unhealthy; and a queue of waiting jobs.
node_rows = st.lists(st.tuples(st.sampled_from([None, "a", "b"]), st.sampled_from([None, 0, 1]),
                               st.sampled_from(["ok", "disabled", "draining", "unhealthy"])), max_size=6)
holder_rows = st.lists(st.tuples(st.one_of(st.none(), st.integers(1, 5)), st.integers(0, 4)), min_size=2, max_size=2)
queue_rows = st.lists(st.tuples(st.integers(1, 3), st.sampled_from([None, "a", "b"]),
                                st.one_of(st.none(), st.integers(1, 6))), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=node_rows, holders=holder_rows, queue=queue_rows)
def test_the_dry_run_on_the_databases_queue_is_what_the_real_dispatcher_does(make_job, stranger, nodes, holders,
                                                                             queue):
    with transaction.atomic():
        spec = cpu_spec()
        pools = {None: None, "a": ResourcePool.objects.create(name="pa"),
                 "b": ResourcePool.objects.create(name="pb", kind=ResourcePool.Kind.DEDICATED)}
        now = timezone.now()
        running = [make_job(owner=stranger, spec=spec, node_count=1, status=JobStatus.RUNNING, auto_stop_hours=hours,
                            started_at=now - timedelta(hours=ran, minutes=7)) for hours, ran in holders]
        for index, (pool, holder, health) in enumerate(nodes):
            Node.objects.create(name=f"d{index}", address=f"10.7.0.{index + 1}", spec=spec, pool=pools[pool],
                                allocated_to=running[holder] if holder is not None else None,
                                enabled=health != "disabled", draining=health == "draining",
                                state=Node.State.NOT_READY if health == "unhealthy" else Node.State.READY)
        for count, pool, hours in queue:
            make_job(spec=spec, node_count=count, pool=pools[pool], auto_stop_hours=hours)
        state = queue_state()
        expected = dry_dispatch(state.queue, state.nodes, state.holder_ends, state.now, state.free_slots)
        started = dispatch_pending()
        assert set(started) == set(expected)
        for job_id in started:
            assert sorted(Node.objects.filter(allocated_to_id=job_id).values_list("name", flat=True)) == sorted(
                expected[job_id])
        transaction.set_rollback(True)


def test_a_slurm_pools_waiting_job_gets_what_slurm_says_and_no_estimate_of_the_consoles(make_job, owner):
    slurm = ResourcePool.objects.create(name="s", backend="slurm")
    Node.objects.create(name="slurm-0", address="10.9.0.1", spec=cpu_spec(), pool=slurm)
    waiting = make_job(spec=cpu_spec(), pool=slurm, node_count=1, slurm_job_id=42, slurm_reason="Priority")
    answer = api_client(owner).get(f"/api/v1/training-jobs/{waiting.pk}/start-forecast").json()
    assert answer["scheduler"] == "slurm" and answer["reason"] == "Slurm job 42: Priority"
    assert answer["earliest"] is None and answer["latest"] is None and answer["alternatives"] == []
    assert answer["estimate"] == "Slurm decides when it starts"
