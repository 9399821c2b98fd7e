"""What the console does when Slurm changes a job it holds, with slurmrestd's answers faked at the HTTP
boundary: each Slurm ending stops the console's job with its own reason, and the stop ends as Slurm meant it
(a time limit is an auto stop, a preemption or a lost node puts the job back in the queue, a job Slurm
forgot ends Abnormal)."""

from unittest.mock import patch

import pytest

from jobs.backends.slurm import (
    SLURM,
    LiveSlurmJob,
    cancel_strays,
    console_job_name,
    look_at_queued,
    look_at_running,
    lost_submission,
)
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


def slurm_runs(started: int, minutes: int):
    record = {"job_id": 77, "job_state": "RUNNING", "state_reason": "None", "start_time": started,
              "time_limit": minutes, "restart_cnt": 0}
    return client({("GET", "/slurm/v0.0.38/job/77"): (200, {"errors": [], "jobs": [record]})})[0]


def test_a_job_near_its_slurm_time_limit_is_stopped_as_an_auto_stop_before_slurm_kills_it(make_job, owner, settings):
    import time

    settings.SLURM_NOTICE_MARGIN_SECONDS, settings.OUTPUT_FINAL_SYNC_SECONDS = 120, 300
    job = running_job(make_job, owner)
    TrainingJob.objects.filter(pk=job.pk).update(checkpoint_grace_seconds=30)
    job.refresh_from_db()

    # 450 s before the limit: the grace (30), the last upload (300) and the margin (120) are still ahead.
    assert look_at_running(slurm_runs(int(time.time()) - 3600 + 470, 60), job) is False
    assert look_at_running(slurm_runs(int(time.time()) - 3600 + 440, 60), job) is True
    job.refresh_from_db()
    assert (job.status, job.stop_reason) == (JobStatus.TERMINATING, StopReason.AUTO_STOP)
    assert job.status_message == "Stopped by auto stop: Slurm's time limit for job 77 is near"
    assert job.slurm_reason == "the time limit of Slurm job 77 is near"


def test_a_slurm_job_without_a_time_limit_runs_on(make_job, owner):
    job = running_job(make_job, owner)
    assert look_at_running(slurm_runs(1, 0xFFFFFFFF), job) is False
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_a_job_slurm_requeued_before_the_console_looked_is_stopped_as_requeued(make_job, owner):
    job = running_job(make_job, owner)
    assert look_at_running(slurm_says("PENDING", "BeginTime"), job) is True
    job.refresh_from_db()
    assert (job.slurm_state, job.stop_reason) == ("REQUEUED", StopReason.SLURM)


@pytest.mark.parametrize(("slurm", "same_slurm_job"), [
    (("PENDING", "BeginTime"), True),  # Slurm requeued it: the same Slurm job runs the next attempt
    (("PREEMPTED", "None"), False),    # Slurm ended it (its preemption mode cancels): submitted anew
    (("NODE_FAIL", "None"), False),
])
def test_a_job_slurm_took_back_waits_in_the_queue_as_its_next_attempt_without_using_a_restart(
        make_job, owner, slurm, same_slurm_job):
    job = running_job(make_job, owner)
    look_at_running(slurm_says(*slurm), job)
    assert end_stop(job.pk) is True
    job.refresh_from_db()
    assert (job.status, job.restart_count, job.stop_reason) == (JobStatus.PENDING, 1, StopReason.USER)
    assert job.max_restarts == 1  # the auto restarts it had are all still there
    assert job.status_message.startswith("Requeued by Slurm (Slurm ")
    assert job.slurm_job_id == (77 if same_slurm_job else None)


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


def slurm_listing(*records) -> dict:
    return {"errors": [], "jobs": list(records)}


def test_a_slurm_job_named_for_an_earlier_job_of_the_same_id_is_not_taken_as_this_ones(make_job, owner):
    job = running_job(make_job, owner)
    created = int(job.created_at.timestamp())
    live = {job.pk: [LiveSlurmJob(5, created - 600), LiveSlurmJob(9, created + 2)]}
    assert lost_submission(job, live) == 9
    assert lost_submission(job, {job.pk: [LiveSlurmJob(5, created - 600)]}) is None


def test_a_pools_sweep_leaves_the_slurm_jobs_another_pool_holds_on_the_same_partition(make_job, owner):
    mine = running_job(make_job, owner, slurm_id=77)
    other_pool = ResourcePool.objects.create(name="slurm-q", backend=ResourcePool.Backend.SLURM,
                                             slurm_partition="batch", slurm_user="svc")
    theirs = make_job(owner=owner, status=JobStatus.RUNNING)
    TrainingJob.objects.filter(pk=theirs.pk).update(pool=other_pool, slurm_job_id=78)
    ResourcePool.objects.filter(pk=mine.pool_id).update(slurm_partition="batch", slurm_user="svc")
    stray_id = mine.pk + theirs.pk + 100
    listing = slurm_listing(*[{"job_id": slurm_id, "name": console_job_name(job_id), "user_name": "svc",
                               "job_state": "RUNNING", "state_reason": "None", "partition": "batch"}
                              for job_id, slurm_id in ((mine.pk, 77), (theirs.pk, 78), (stray_id, 79))],
                            # A cluster user's job of the same name is not the console's to cancel.
                            {"job_id": 80, "name": console_job_name(stray_id), "user_name": "someone",
                             "job_state": "RUNNING", "state_reason": "None", "partition": "batch"})
    rest, fake = client({("GET", "/slurm/v0.0.38/jobs"): (200, listing),
                         ("DELETE", "/slurm/v0.0.38/job/79"): (200, {"errors": []})})
    cancel_strays(rest, ResourcePool.objects.get(pk=mine.pool_id))
    assert [(request.method, request.path_url) for request in fake.requests if request.method == "DELETE"] == [
        ("DELETE", "/slurm/v0.0.38/job/79")]


def test_a_job_that_just_ended_keeps_its_slurm_job_until_slurm_has_ended_it_as_told(make_job, owner):
    """Told how its job ended (SIGUSR1), a Slurm job runs on while its batch script waits for its step: a sweep then
    must not cancel it, or Slurm would record a completed job CANCELLED. Long past that, it is a stray."""
    from datetime import timedelta

    from django.utils import timezone

    job = running_job(make_job, owner, slurm_id=77)
    listing = slurm_listing({"job_id": 77, "name": console_job_name(job.pk), "user_name": "svc",
                             "job_state": "RUNNING", "state_reason": "None", "partition": "batch"})
    ResourcePool.objects.filter(pk=job.pool_id).update(slurm_partition="batch", slurm_user="svc")

    def sweep_cancels(**state) -> bool:
        TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED, **state)
        rest, fake = client({("GET", "/slurm/v0.0.38/jobs"): (200, listing),
                             ("DELETE", "/slurm/v0.0.38/job/77"): (200, {"errors": []})})
        cancel_strays(rest, ResourcePool.objects.get(pk=job.pool_id))
        return any(request.method == "DELETE" for request in fake.requests)

    assert not sweep_cancels(slurm_released=False, ended_at=timezone.now() - timedelta(hours=1)), "not yet told"
    assert not sweep_cancels(slurm_released=True, ended_at=timezone.now() - timedelta(seconds=5)), "ending as told"
    assert sweep_cancels(slurm_released=True, ended_at=timezone.now() - timedelta(minutes=5))


def test_a_submission_slurm_refuses_fails_that_job_alone_and_the_pool_goes_on(make_job, owner):
    first = running_job(make_job, owner)
    TrainingJob.objects.filter(pk=first.pk).update(status=JobStatus.PENDING, slurm_job_id=None)
    second = make_job(owner=owner)
    TrainingJob.objects.filter(pk=second.pk).update(pool=first.pool_id, slurm_job_id=55)
    refused = {"errors": [{"error": "Requested time limit is invalid (missing or exceeds some limit)"}]}
    rest, _ = client({("GET", "/slurm/v0.0.38/jobs"): (200, slurm_listing()),
                      ("POST", "/slurm/v0.0.38/job/submit"): (500, refused),
                      ("GET", "/slurm/v0.0.38/job/55"): (200, slurm_listing(
                          {"job_id": 55, "job_state": "PENDING", "state_reason": "Priority"}))})
    pool = ResourcePool.objects.get(pk=first.pool_id)
    with patch("jobs.backends.slurm.client_for", return_value=rest):
        assert SLURM.dispatch() == []
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, first.status_message) == (
        JobStatus.FAILED, "Slurm refused the job: Requested time limit is invalid (missing or exceeds some limit)")
    assert second.slurm_reason == "waiting for higher-priority jobs (Priority)"
    pool.refresh_from_db()
    assert pool.slurm_status == ""  # the pool itself is fine


def test_one_pools_failure_does_not_stop_the_others_being_watched(make_job, owner):
    broken = running_job(make_job, owner, slurm_id=77)
    healthy_pool = ResourcePool.objects.create(name="slurm-ok", backend=ResourcePool.Backend.SLURM)
    healthy = make_job(owner=owner, status=JobStatus.RUNNING)
    TrainingJob.objects.filter(pk=healthy.pk).update(pool=healthy_pool, slurm_job_id=88)
    cancelled = client({("GET", "/slurm/v0.0.38/job/88"): (200, slurm_listing(
        {"job_id": 88, "job_state": "CANCELLED", "state_reason": "None"}))})[0]

    def client_of(pool):
        if pool.pk == broken.pool_id:
            raise ValueError("a secret no key opens")
        return cancelled

    with patch("jobs.backends.slurm.client_for", side_effect=client_of):
        assert SLURM.watch() == [healthy.pk]
    assert ResourcePool.objects.get(pk=broken.pool_id).slurm_status.startswith("the console could not watch")


def test_a_job_slurm_requeued_and_ran_again_while_the_console_did_not_look_is_stopped_as_requeued(make_job, owner):
    job = running_job(make_job, owner)
    record = {"job_id": 77, "job_state": "RUNNING", "state_reason": "None", "restart_cnt": 1}
    rest = client({("GET", "/slurm/v0.0.38/job/77"): (200, {"errors": [], "jobs": [record]})})[0]
    assert look_at_running(rest, job) is True
    job.refresh_from_db()
    assert (job.status, job.slurm_state) == (JobStatus.TERMINATING, "REQUEUED")


def test_the_watch_does_nothing_on_a_console_without_a_slurm_pool(make_job, owner):
    from jobs.tasks import watch_slurm_jobs
    from tests.fixtures import add_nodes

    job = make_job(owner=owner, node_count=1)
    add_nodes(job.spec, 1, prefix="free")
    assert watch_slurm_jobs() == []
    job.refresh_from_db()
    # Not even dispatched: the periodic dispatch and the wake-ups do that for the console's own pools.
    assert job.status == JobStatus.PENDING


def test_a_slurm_pools_auto_stop_that_leaves_no_time_past_the_stop_before_it_is_refused_at_submission(
        catalogue, api, settings, django_capture_on_commit_callbacks):
    from jobs.models import LauncherDefaults, Node, ResourceSpec
    from tests.fixtures import job_body

    settings.OUTPUT_FINAL_SYNC_SECONDS, settings.SLURM_NOTICE_MARGIN_SECONDS = 300, 120
    defaults = LauncherDefaults.current()
    defaults.checkpoint_grace_max_seconds = 7200
    defaults.save()
    pool = ResourcePool.objects.create(name="slurm-p", backend=ResourcePool.Backend.SLURM)
    Node.objects.filter(spec=ResourceSpec.objects.get(name="cpu")).update(pool=pool)

    def submit(grace: int):
        with django_capture_on_commit_callbacks(execute=False):
            return api.post("/api/v1/training-jobs", job_body(pool="slurm-p", auto_stop_hours=1,
                                                              checkpoint_grace_seconds=grace), format="json")

    refused = submit(3180)  # 3180 + 300 + 120 = 3600: stopped as it starts
    assert refused.status_code == 400
    assert refused.json()["checkpoint_grace_seconds"] == [
        "On this Slurm pool a job is stopped 3600 s before its auto stop of 1 h (its notice, its last upload and its "
        "teardown), which leaves it no time to run: choose a shorter notice or a later auto stop."]
    assert submit(60).status_code == 201


def slurm_preempts(grace_left: int, slurm_id: int = 77, state: str = "RUNNING"):
    import time

    now = int(time.time())
    record = {"job_id": slurm_id, "job_state": state, "state_reason": "None", "restart_cnt": 0,
              "preempt_time": now - 5, "end_time": now + grace_left}
    return client({("GET", f"/slurm/v0.0.38/job/{slurm_id}"): (200, {"errors": [], "jobs": [record]})})[0]


def test_a_job_slurm_begins_to_preempt_is_stopped_at_once_with_its_notice_bounded_by_slurms_grace(make_job, owner):
    from django.utils import timezone

    job = running_job(make_job, owner)
    assert look_at_running(slurm_preempts(60), job) is True
    job.refresh_from_db()
    assert (job.status, job.stop_reason, job.slurm_state) == (JobStatus.TERMINATING, StopReason.SLURM, "PREEMPTING")
    assert job.status_message.startswith("Slurm preempted job 77 for a higher-priority job: it takes the nodes back in")
    # The end of Slurm's grace, less the clock skew the console allows for.
    left = (job.notice_ends_by - timezone.now()).total_seconds()
    assert 50 <= left <= 56
    # Its stop ends as a preemption: back in the queue on the same Slurm job, which Slurm requeues.
    assert end_stop(job.pk) is True
    job.refresh_from_db()
    assert (job.status, job.slurm_job_id, job.max_restarts, job.notice_ends_by) == (JobStatus.PENDING, 77, 1, None)


@pytest.mark.parametrize("state", ["RUNNING", "COMPLETING"])
def test_a_requeued_job_does_not_take_the_nodes_slurm_is_still_taking_back(make_job, owner, state):
    job = running_job(make_job, owner)
    look_at_running(slurm_preempts(60), job)
    end_stop(job.pk)
    job.refresh_from_db()
    with patch("jobs.backends.slurm.allocation.assign") as assign:
        assert look_at_queued(slurm_preempts(20, state=state), job) is False
    assign.assert_not_called()
    job.refresh_from_db()
    assert (job.status, job.slurm_job_id) == (JobStatus.PENDING, 77)
    assert job.slurm_reason == "Slurm is taking its nodes back (a preemption) and will queue it again"


def test_a_job_slurm_ended_for_a_preemption_instead_of_requeueing_is_submitted_anew(make_job, owner):
    job = running_job(make_job, owner)
    look_at_running(slurm_preempts(60), job)
    end_stop(job.pk)
    job.refresh_from_db()
    assert look_at_queued(slurm_says("PREEMPTED"), job) is False
    job.refresh_from_db()
    assert (job.status, job.slurm_job_id) == (JobStatus.PENDING, None)
