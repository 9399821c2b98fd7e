"""What the console does when Slurm changes a job it holds, with slurmrestd's answers faked at the HTTP
boundary: each Slurm ending stops the console's job with its own reason, and the stop ends as Slurm meant it
(a time limit is an auto stop, a preemption or a lost node puts the job back in the queue, a job Slurm
forgot ends Abnormal)."""

import pytest

from jobs.backends.slurm import look_at_queued, look_at_running
from jobs.models import SLURM_VANISHED, JobStatus, ResourcePool, StopReason, TrainingJob
from jobs.runtime.ending import end_stop
from tests.unit.test_slurm_client import client

pytestmark = pytest.mark.django_db


def running_job(make_job, owner, slurm_id: int = 77) -> TrainingJob:
    pool = ResourcePool.objects.create(name="slurm-p", backend=ResourcePool.Backend.SLURM)
    job = make_job(owner=owner, status=JobStatus.RUNNING)
    TrainingJob.objects.filter(pk=job.pk).update(pool=pool, slurm_job_id=slurm_id, slurm_state="RUNNING")
    job.refresh_from_db()
    return job


def slurm_says(state: str, reason: str = "None", slurm_id: int = 77):
    record = {"job_id": slurm_id, "job_state": state, "state_reason": reason}
    return client({("GET", f"/slurm/v0.0.38/job/{slurm_id}"): (200, {"errors": [], "jobs": [record]})})[0]


def test_a_job_slurm_still_runs_is_left_alone(make_job, owner):
    job = running_job(make_job, owner)
    assert look_at_running(slurm_says("RUNNING"), job) is False
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


@pytest.mark.parametrize(("state", "reason", "words"), [
    ("CANCELLED", StopReason.SLURM, "Slurm cancelled job 77 (scancel, from outside the console)"),
    ("TIMEOUT", StopReason.AUTO_STOP, "Stopped by auto stop: Slurm's time limit for job 77 ran out"),
    ("PREEMPTED", StopReason.SLURM, "Slurm preempted job 77 for a higher-priority job"),
    ("NODE_FAIL", StopReason.SLURM, "Slurm lost a node of job 77 (NODE_FAIL)"),
])
def test_what_slurm_ended_stops_the_job_saying_why(make_job, owner, state, reason, words):
    job = running_job(make_job, owner)
    assert look_at_running(slurm_says(state), job) is True
    job.refresh_from_db()
    assert (job.status, job.stop_reason, job.status_message, job.slurm_state) == (
        JobStatus.TERMINATING, reason, words, state)


def test_a_job_requeued_before_the_console_looked_counts_as_preempted(make_job, owner):
    job = running_job(make_job, owner)
    assert look_at_running(slurm_says("PENDING", "BeginTime"), job) is True
    job.refresh_from_db()
    assert (job.slurm_state, job.stop_reason) == ("PREEMPTED", StopReason.SLURM)


@pytest.mark.parametrize("state", ["PREEMPTED", "NODE_FAIL"])
def test_a_job_slurm_took_back_waits_in_the_queue_as_its_next_attempt_without_using_a_restart(make_job, owner, state):
    job = running_job(make_job, owner)
    look_at_running(slurm_says(state), job)
    assert end_stop(job.pk) is True
    job.refresh_from_db()
    assert (job.status, job.restart_count, job.stop_reason) == (JobStatus.PENDING, 1, StopReason.USER)
    assert job.max_restarts == 1  # the auto restarts it had are all still there
    assert job.status_message.startswith("Requeued by Slurm (Slurm ")
    assert job.slurm_job_id == 77  # Slurm runs the same job again


def test_a_job_slurm_forgot_ends_abnormal_saying_so(make_job, owner):
    job = running_job(make_job, owner)
    gone = {"errors": [{"error": "Invalid job id specified"}]}
    rest = client({("GET", "/slurm/v0.0.38/job/77"): (500, gone)})[0]
    assert look_at_running(rest, job) is True
    assert end_stop(job.pk) is True
    job.refresh_from_db()
    assert (job.status, job.slurm_state, job.status_message) == (
        JobStatus.ABNORMAL, SLURM_VANISHED, "Slurm no longer knows its job 77")


def test_a_users_stop_still_ends_terminated(make_job, owner):
    job = running_job(make_job, owner)
    job.terminate()
    assert end_stop(job.pk) is True
    job.refresh_from_db()
    assert job.status == JobStatus.TERMINATED


def test_a_queued_job_shows_slurms_reason_in_words(make_job, owner):
    job = running_job(make_job, owner)
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.PENDING)
    job.refresh_from_db()
    assert look_at_queued(slurm_says("PENDING", "Priority"), job) is False
    job.refresh_from_db()
    assert (job.status, job.slurm_reason) == (JobStatus.PENDING, "waiting for higher-priority jobs (Priority)")


def test_a_queued_job_cancelled_in_slurm_ends_terminated_saying_so(make_job, owner):
    job = running_job(make_job, owner)
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.PENDING)
    job.refresh_from_db()
    look_at_queued(slurm_says("CANCELLED"), job)
    job.refresh_from_db()
    assert (job.status, job.status_message) == (JobStatus.TERMINATED, "Slurm cancelled its job 77 before it ran")
