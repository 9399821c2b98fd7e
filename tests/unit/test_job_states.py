"""Job states: illegal transitions are refused, and a job whose run was lost does not keep its nodes."""

import os
import socket
import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import IllegalTransition, JobEvent, JobStatus, Node, TrainingJob, Worker
from jobs.runtime.reaper import reap_orphaned_jobs
from jobs.runtime.takeover import claim
from jobs.secret_box import seal_secret

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

    assert reap_orphaned_jobs().ended == [job.pk]

    job.refresh_from_db()
    assert job.status == JobStatus.ABNORMAL
    assert "lost" in job.status_message
    node.refresh_from_db()
    assert node.allocated_to is None


def test_a_running_job_that_beats_is_left_alone(job):
    job.begin_creating()
    job.start()
    assert reap_orphaned_jobs().ended == []
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_a_job_whose_run_waits_in_the_queue_is_not_taken_for_lost(job):
    job.begin_creating()
    assert job.heartbeat_at is None
    assert reap_orphaned_jobs().ended == []
    job.refresh_from_db()
    assert job.status == JobStatus.CREATING


def test_a_job_whose_run_never_started_is_reaped_after_the_grace_period(job):
    node = Node.objects.create(name="n0", address="10.0.0.1", spec=job.spec, allocated_to=job)
    job.begin_creating()
    JobEvent.objects.filter(job=job, kind="state:Creating").update(at=timezone.now() - timedelta(minutes=20))

    assert reap_orphaned_jobs().ended == [job.pk]

    job.refresh_from_db()
    node.refresh_from_db()
    assert job.status == JobStatus.ABNORMAL
    assert node.allocated_to is None


def running_job_with_keys(job, **fields):
    """A Running job as a run leaves it once launched: keys kept, an owner named, one worker on a node."""
    node = Node.objects.create(name="n0", address="10.0.0.1", spec=job.spec, allocated_to=job)
    Worker.objects.create(job=job, index=0, node=node, node_name="n0", address="10.0.0.1", hostname="h")
    job.begin_creating()
    job.start()
    TrainingJob.objects.filter(pk=job.pk).update(sealed_ssh_key=seal_secret("key"), **fields)
    return node


def test_a_running_job_whose_run_stopped_beating_is_handed_on_not_ended(job):
    stale = timezone.now() - timedelta(minutes=5)
    node = running_job_with_keys(job, heartbeat_at=stale, run_owner="elsewhere:1:ab")

    result = reap_orphaned_jobs()

    assert result.ended == []
    assert [(item.job_id, item.owner, item.heartbeat_at) for item in result.resumable] == [(job.pk, "elsewhere:1:ab", stale)]
    job.refresh_from_db()
    node.refresh_from_db()
    assert job.status == JobStatus.RUNNING and node.allocated_to_id == job.pk


def test_a_run_whose_process_on_this_host_is_gone_is_handed_on_before_its_heartbeat_goes_stale(job):
    ended = subprocess.Popen(["true"])
    ended.wait()  # its pid no longer runs
    dead_pid = ended.pid
    running_job_with_keys(job, heartbeat_at=timezone.now(), run_owner=f"{socket.gethostname()}:{dead_pid}:ab")

    assert [item.job_id for item in reap_orphaned_jobs().resumable] == [job.pk]


def test_a_run_of_a_live_process_with_a_fresh_heartbeat_is_not_handed_on(job):
    running_job_with_keys(job, heartbeat_at=timezone.now(), run_owner=f"{socket.gethostname()}:{os.getpid()}:ab")

    assert reap_orphaned_jobs().resumable == []


def test_only_one_worker_takes_up_a_run(job):
    stale = timezone.now() - timedelta(minutes=5)
    running_job_with_keys(job, heartbeat_at=stale, run_owner="elsewhere:1:ab")

    first = claim(job.pk, "elsewhere:1:ab", stale)
    second = claim(job.pk, "elsewhere:1:ab", stale)

    assert first and second is None
    assert TrainingJob.objects.get(pk=job.pk).run_owner == first


def test_a_job_stopped_before_any_run_began_is_ended_by_the_reaper_and_frees_its_nodes(job):
    node = Node.objects.create(name="n0", address="10.0.0.1", spec=job.spec, allocated_to=job)
    job.begin_creating()
    job.terminate()
    JobEvent.objects.filter(job=job, kind="state:Terminating").update(at=timezone.now() - timedelta(seconds=30))

    assert reap_orphaned_jobs().ended == [job.pk]

    job.refresh_from_db()
    node.refresh_from_db()
    assert job.status == JobStatus.TERMINATED
    assert node.allocated_to is None


def test_a_stopped_job_whose_run_beats_is_left_to_its_run(job):
    job.begin_creating()
    TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now(), run_owner="elsewhere:1:ab",
                                                 sealed_ssh_key=seal_secret("key"))
    job.terminate()
    JobEvent.objects.filter(job=job, kind="state:Terminating").update(at=timezone.now() - timedelta(seconds=30))

    assert reap_orphaned_jobs().ended == []
    assert TrainingJob.objects.get(pk=job.pk).status == JobStatus.TERMINATING


def test_a_committed_change_of_state_is_announced_to_the_later_stages_that_listen(make_job, monkeypatch,
                                                                                 django_capture_on_commit_callbacks):
    from jobs import notifications
    from jobs.logs import progress

    heard: list = []
    monkeypatch.setattr(progress.JobProgressPublisher, "state_changed",
                        lambda publisher, status: heard.append(("progress", publisher.job_id, status)))
    monkeypatch.setattr(notifications, "_listened_to", lambda job_id: heard.append(("notifications", job_id)) or False)
    job = make_job(status=JobStatus.CREATING)

    with django_capture_on_commit_callbacks(execute=True):
        job.transition(JobStatus.RUNNING)
        assert heard == [], "nothing is told before the commit"
    with django_capture_on_commit_callbacks(execute=True):
        job.finish(1)

    assert heard == [("progress", job.pk, "Running"), ("progress", job.pk, "Failed"), ("notifications", job.pk)]


def test_the_reaper_queues_one_resume_per_lost_run_however_often_it_looks(job, monkeypatch):
    from django.core.cache import cache

    from jobs import tasks

    cache.clear()
    queued: list[tuple] = []
    monkeypatch.setattr(tasks.resume_job, "delay", lambda *args: queued.append(args))
    monkeypatch.setattr(tasks.dispatch_pending_jobs, "delay", lambda *args: None)
    running_job_with_keys(job, heartbeat_at=timezone.now() - timedelta(hours=1), run_owner="elsewhere:1:ab")

    for _look in range(3):  # the beat's looks while the resume waits for a run thread
        tasks.reap_orphaned_jobs()

    assert [args[0] for args in queued] == [job.pk]
