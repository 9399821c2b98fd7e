"""Job states: illegal transitions are refused, and a job whose run was lost does not keep its nodes."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import IllegalTransition, JobEvent, JobStatus, Node, TrainingJob, Worker
from jobs.runtime.reaper import reap_orphaned_jobs

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(make_job):
    return make_job(node_count=1)


def test_a_pending_job_cannot_complete(job):
    with pytest.raises(IllegalTransition):
        job.finish(0)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


def test_stopping_a_pending_job_ends_it_at_once(job):
    assert job.terminate() is True
    job.refresh_from_db()
    assert job.status == JobStatus.TERMINATED
    assert job.ended_at is not None


def test_a_finished_job_cannot_be_stopped(job):
    job.begin_creating()
    job.start()
    job.finish(0)
    with pytest.raises(IllegalTransition):
        job.terminate()


def test_each_transition_leaves_an_event_on_the_timeline(job):
    job.begin_creating()
    job.start()
    job.finish(2)
    assert [event.kind for event in job.events.all()] == ["state:Creating", "state:Running", "state:Failed"]
    assert job.exit_code == 2


def test_a_running_job_whose_run_stopped_beating_is_made_abnormal_and_frees_its_nodes(job):
    node = Node.objects.create(name="n0", address="10.0.0.1", spec=job.spec, allocated_to=job)
    Worker.objects.create(job=job, index=0, node=node, node_name="n0", address="10.0.0.1", hostname="h")
    job.begin_creating()
    job.start()
    TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=5))

    assert reap_orphaned_jobs() == [job.pk]

    job.refresh_from_db()
    assert job.status == JobStatus.ABNORMAL
    assert "lost" in job.status_message
    node.refresh_from_db()
    assert node.allocated_to is None


def test_a_running_job_that_beats_is_left_alone(job):
    job.begin_creating()
    job.start()
    assert reap_orphaned_jobs() == []
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_a_job_whose_run_waits_in_the_queue_is_not_taken_for_lost(job):
    job.begin_creating()
    assert job.heartbeat_at is None
    assert reap_orphaned_jobs() == []
    job.refresh_from_db()
    assert job.status == JobStatus.CREATING


def test_a_job_whose_run_never_started_is_reaped_after_the_grace_period(job):
    node = Node.objects.create(name="n0", address="10.0.0.1", spec=job.spec, allocated_to=job)
    job.begin_creating()
    JobEvent.objects.filter(job=job, kind="state:Creating").update(at=timezone.now() - timedelta(minutes=20))

    assert reap_orphaned_jobs() == [job.pk]

    job.refresh_from_db()
    node.refresh_from_db()
    assert job.status == JobStatus.ABNORMAL
    assert node.allocated_to is None
