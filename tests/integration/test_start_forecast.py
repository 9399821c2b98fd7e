"""The start forecast on the local cluster, with a scripted queue: two jobs hold its two nodes with known auto
stops, two more wait; the estimates come from those auto stops, and the alternative proposed once a node is
free, applied, really starts the job."""

from datetime import timedelta

from jobs.models import FINAL_STATES, JobStatus, Node, TrainingJob
from jobs.pages.waiting_forecast import job_forecast
from jobs.submission import task_queue
from jobs.submission.forms import TrainingJobForm
from jobs.submission.jobs import request_stop, submit_job
from tests.integration.helpers import code_dir_from_program, wait_for

HANGS = [{"name": "rank", "value": "-1"}]  # no rank blocks: each keeps printing a heartbeat for half an hour


def submitted(owner, name: str, node_count: int, auto_stop_hours: int | None) -> TrainingJob:
    data = {"name": name, "engine": "local-mpi4py", "code_dir": "hang", "boot_file": "hang.py", "spec": "local-cpu",
            "node_count": node_count, "auto_stop_hours": auto_stop_hours, "parameters": HANGS}
    form = TrainingJobForm(data, user=owner)
    assert form.is_valid(), form.errors
    return submit_job(form, owner)


def forecast_of(job: TrainingJob) -> dict:
    forecast = job_forecast(TrainingJob.objects.select_related("pool").get(pk=job.pk))
    assert forecast is not None, f"job {job.pk} is not waiting"
    return dict(forecast)


def test_a_scripted_queue_gets_its_estimates_from_the_auto_stops_and_a_proposed_shorter_limit_starts_the_job(
        console, owner):
    code_dir_from_program("hang", "hang.py")
    two_hours = submitted(owner, "holds-a-node-2h", 1, 2)
    three_hours = submitted(owner, "holds-a-node-3h", 1, 3)
    for job in (two_hours, three_hours):
        wait_for(job, [JobStatus.RUNNING], timeout=180)
    head = submitted(owner, "needs-both-1h", 2, 1)
    behind = submitted(owner, "needs-one-no-limit", 1, None)
    try:
        three_hours.refresh_from_db()
        both_free = three_hours.started_at + timedelta(hours=3)

        on_head = forecast_of(head)
        assert on_head["position"] == 1 and not on_head["starts_now"] and on_head["alternatives"] == []
        assert on_head["earliest"] == on_head["latest"] == both_free.isoformat()
        assert f"#{two_hours.pk} (1 node(s)) until about" in on_head["reason"]
        on_behind = forecast_of(behind)
        # Behind the head: as soon as the head starts (it ends at once), or after the head's own hour.
        assert on_behind["position"] == 2 and on_behind["earliest"] == both_free.isoformat()
        assert on_behind["latest"] == (both_free + timedelta(hours=1)).isoformat()

        # One node comes free: the head still waits for the other; the job behind it, having no auto stop,
        # may not jump the queue, but a limit that ends before the head can start would let it.
        request_stop(two_hours)
        wait_for(two_hours, FINAL_STATES, timeout=180)
        assert Node.objects.filter(allocated_to__isnull=True).count() == 1
        # The head submitted again with 1 node would come after the job behind it, which would take the node:
        # nothing is proposed that would not start.
        assert forecast_of(head)["alternatives"] == []
        [shorter] = [alternative for alternative in forecast_of(behind)["alternatives"]
                     if alternative["kind"] == "shorter_auto_stop"]
        assert shorter["auto_stop_hours"] == 2  # under 3 h less the minutes the 3-hour job has run

        TrainingJob.objects.filter(pk=behind.pk).update(auto_stop_hours=shorter["auto_stop_hours"])
        task_queue.wake_dispatcher()
        wait_for(behind, [JobStatus.RUNNING], timeout=180)
        head.refresh_from_db()
        assert head.status == JobStatus.PENDING
    finally:
        for job in (head, behind, three_hours, two_hours):
            job.refresh_from_db()
            if job.status not in FINAL_STATES:
                request_stop(job)
        for job in (behind, three_hours):
            wait_for(job, FINAL_STATES, timeout=180)
