"""A waiting job's start forecast as the job page, the capacity page and the API give it, and its alternatives
applied in the database: the real dispatcher starts each one."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from jobs.allocation import dispatch_pending
from jobs.models import JobStatus, Node, ResourcePool, TrainingJob
from jobs.pages.waiting_forecast import job_forecast
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
            TrainingJob.objects.filter(pk=waiting.pk).update(
                node_count=alternative["node_count"], pool=pool, auto_stop_hours=alternative["auto_stop_hours"])
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
    assert 'id="start-forecast"' in page and "with 1 node it could start now" in page
    assert f"#{holder.pk} (1 node(s)) until about {timezone.localtime(end).strftime('%H:%M')}" in page
    answer = api_client(owner).get(f"/api/v1/training-jobs/{waiting.pk}/start-forecast").json()
    assert answer["waiting"] and answer["position"] == 1 and answer["scheduler"] == "console"
    assert "the pool b has 2 free nodes of this spec: submitted there, it could start now" in [
        alternative["words"] for alternative in answer["alternatives"]]
    assert "the pool b has 2 free nodes" in client.get("/capacity").content.decode()


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
    assert " may start: by about " in shown and "    sooner: with 1 node it could start now" in shown
