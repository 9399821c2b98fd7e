"""A job's events in the API: its owner reads them oldest first; a stranger is told the job does not exist."""

import pytest

from jobs.models import JobEvent
from tests.fixtures import api_client
from tests.unit.log_helpers import quiet_redis  # noqa: F401

pytestmark = pytest.mark.django_db


def test_the_owner_reads_the_jobs_events_oldest_first(make_job, owner):
    job = make_job(owner=owner)
    job.begin_creating()
    JobEvent.objects.create(job=job, kind="pre-check", message="worker-0 container is up")

    response = api_client(owner).get(f"/api/v1/training-jobs/{job.pk}/events")

    assert response.status_code == 200
    assert [(item["kind"], item["message"]) for item in response.json()] == [
        ("state:Creating", "Nodes allocated, preparing the containers"), ("pre-check", "worker-0 container is up")]


def test_a_stranger_does_not_see_another_persons_events(make_job, owner, stranger):
    job = make_job(owner=owner)
    assert api_client(stranger).get(f"/api/v1/training-jobs/{job.pk}/events").status_code == 404


@pytest.mark.usefixtures("quiet_redis")
def test_a_stop_through_the_api_says_who_asked_for_it(make_job, owner):
    job = make_job(owner=owner)
    job.begin_creating()
    assert api_client(owner).post(f"/api/v1/training-jobs/{job.pk}/stop").status_code == 200
    assert [(event.kind, event.message) for event in job.events.order_by("id")][1:] == [
        ("state:Terminating", "Stop requested by owner")], "the stop's own change of state says who asked, once"
