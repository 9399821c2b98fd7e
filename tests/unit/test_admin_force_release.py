"""Force release in the back office: asked first, then done, and written to the admin's history; a node
still held by a live job is refused (freeing it would book it twice)."""

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from jobs.models import JobStatus, Node, TrainingJob
from tests.fixtures import add_nodes, person
from tests.unit.log_helpers import quiet_redis  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet_redis")]


@pytest.fixture
def admin_client():
    client = Client()
    client.force_login(person("root-admin", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def stuck_job(make_job):
    """A job caught in Terminating with both its nodes, as a stop that never finished left it."""
    job = make_job(node_count=2)
    nodes = add_nodes(job.spec, 2)
    Node.objects.filter(pk__in=[node.pk for node in nodes]).update(allocated_to=job)
    job.begin_creating()
    job.terminate()
    return job


def act(client, model: str, action: str, ids, confirmed: bool):
    data = {"action": action, "_selected_action": [str(pk) for pk in ids]}
    if confirmed:
        data["confirmed"] = "yes"
    return client.post(f"/admin/jobs/{model}/", data)


def test_force_releasing_a_job_asks_first_and_changes_nothing_until_confirmed(admin_client, stuck_job):
    response = act(admin_client, "trainingjob", "force_release", [stuck_job.pk], confirmed=False)

    assert response.status_code == 200
    assert b"Force release?" in response.content and stuck_job.name.encode() in response.content
    assert TrainingJob.objects.get(pk=stuck_job.pk).status == JobStatus.TERMINATING
    assert Node.objects.filter(allocated_to=stuck_job).count() == 2


def test_a_confirmed_force_release_ends_the_job_frees_its_nodes_for_a_check_and_is_audited(admin_client, stuck_job):
    response = act(admin_client, "trainingjob", "force_release", [stuck_job.pk], confirmed=True)

    assert response.status_code == 302
    job = TrainingJob.objects.get(pk=stuck_job.pk)
    assert (job.status, job.status_message) == (JobStatus.ABNORMAL, "Force released by root-admin")
    assert not Node.objects.filter(allocated_to__isnull=False).exists()
    assert set(Node.objects.values_list("state", flat=True)) == {Node.State.NOT_READY}
    assert job.events.filter(kind="force-release").exists()
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert entry.user.username == "root-admin" and "Force released by root-admin" in entry.change_message


def test_a_node_held_by_a_live_job_is_not_force_released(admin_client, stuck_job):
    node = Node.objects.filter(allocated_to=stuck_job).first()

    act(admin_client, "node", "force_release", [node.pk], confirmed=True)

    node.refresh_from_db()
    assert node.allocated_to_id == stuck_job.pk
    assert not LogEntry.objects.exists()


def test_a_node_whose_job_has_ended_is_freed_and_kept_out_of_service_until_its_check(admin_client, make_job):
    job = make_job(status=JobStatus.FAILED)
    [node] = add_nodes(job.spec, 1)
    Node.objects.filter(pk=node.pk).update(allocated_to=job)

    act(admin_client, "node", "force_release", [node.pk], confirmed=True)

    node.refresh_from_db()
    assert node.allocated_to is None and node.state == Node.State.NOT_READY
    assert LogEntry.objects.filter(object_id=str(node.pk)).exists()


def test_someone_without_the_permission_cannot_force_release(stuck_job, staff):
    client = Client()
    client.force_login(staff)
    act(client, "trainingjob", "force_release", [stuck_job.pk], confirmed=True)
    assert TrainingJob.objects.get(pk=stuck_job.pk).status == JobStatus.TERMINATING
