"""The results and metrics of a job as its owner sees them: the panels on the page and the API's answers."""

import pytest
from django.template.loader import render_to_string
from django.test import RequestFactory
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import JobOutputFile, JobStatus, MetricPoint, RankOutcome, TrainingJob
from tests.fixtures import api_client

pytestmark = pytest.mark.django_db

CARD = {
    "kind": "exception", "title": "Rank 3 (worker-1, node-b) raised ValueError: bad <batch>", "rank": 3, "worker": 1,
    "node": "node-b", "how": "exit code 1", "exit_code": 1, "signal": None, "exception": "ValueError: bad <batch>",
    "where": 'File "train.py", line 3', "last_lines": ["Traceback (most recent call last):", "ValueError: bad <batch>"],
    "others": [{"what": "ended by mpirun (SIGTERM) after rank 3 failed", "ranks": [0, 1, 2]}], "mpirun": "", "nccl": [],
    "hints": [],
}


@pytest.fixture
def job(make_job, owner):
    return make_job(
        owner=owner, status=JobStatus.FAILED, exit_code=1, failure=CARD, watchdog_seconds=30,
        metric_definitions=[{"name": "loss", "regex": "loss=(\\S+)"}, {"name": "acc", "regex": "acc=(\\S+)"}],
        cleanup_report={"checked_at": "2026-01-01T00:00:00+00:00", "clean": False, "workers": [
            {"worker": 0, "node": "node-a", "clean": True, "processes_left": 0, "problem": ""},
            {"worker": 1, "node": "node-b", "clean": False, "processes_left": 1, "problem": "1 process(es) could not be ended"}]},
        outputs_summary={"state": "partial", "message": "kept 1 file(s)", "train_url": "/home/ma-user/out", "kept_files": 1},
    )


def render_panel(job, owner) -> str:
    request = RequestFactory().get(f"/jobs/{job.pk}")
    request.user = owner
    return render_to_string("jobs/_results_panel.html", {"job": job}, request=request)


def test_the_results_panel_shows_the_card_each_ranks_end_the_cleanup_and_the_outputs(job, owner):
    RankOutcome.objects.create(job=job, rank=3, worker_index=1, node_name="node-b", exit_code=1)
    RankOutcome.objects.create(job=job, rank=0, worker_index=0, node_name="node-a", signal=15, stop_signal="TERM")
    JobOutputFile.objects.create(job=job, path="result.txt", size=10, kept=True)
    JobOutputFile.objects.create(job=job, path="big.bin", size=10**9, kept=False)
    html = render_panel(job, owner)

    assert "Why it failed" in html and "raised ValueError: bad &lt;batch&gt;" in html
    assert "ended by signal 15 (SIGTERM: Terminated), after SIGTERM was sent to it" in html
    assert "worker-1 (node-b):\n            1 process(es) could not be ended" in html
    assert f"/api/v1/training-jobs/{job.pk}/outputs/result.txt" in html and "not kept" in html


def test_a_suspected_hung_job_lists_its_silent_ranks_with_a_stop_button(job, owner):
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING, failure={}, suspected_hung_since=timezone.now(),
                                                silent_ranks=[{"rank": 1, "worker": 0, "node": "node-a",
                                                               "silent_since": "2026-01-01T00:00:00+00:00", "last_line": "step 40"}])
    job.refresh_from_db()
    html = render_panel(job, owner)
    assert "Suspected hung" in html and "printed nothing for more than 30 s" in html
    assert "<code>step 40</code>" in html
    assert f'action="/jobs/{job.pk}/stop"' in html


def test_metric_points_come_after_a_cursor_and_a_metric_that_never_matched_says_so(job, owner):
    now = timezone.now()
    points = [MetricPoint.objects.create(job=job, name="loss", rank=0, step=step, value=1.0 / step, at=now, seq=step)
              for step in (1, 2, 3)]
    api = APIClient()
    api.force_authenticate(owner)

    everything = api.get(f"/api/v1/training-jobs/{job.pk}/metrics").json()
    assert [point["step"] for point in everything["points"]] == [1, 2, 3]
    assert everything["next"] == points[-1].id
    later = api.get(f"/api/v1/training-jobs/{job.pk}/metrics", {"after": points[0].id}).json()
    assert [point["step"] for point in later["points"]] == [2, 3]
    by_name = {metric["name"]: metric for metric in everything["metrics"]}
    assert by_name["loss"]["count"] == 3 and by_name["loss"]["last"]["value"] == pytest.approx(1 / 3)
    assert by_name["acc"]["note"] == "No log line matched this metric."


def test_a_stranger_sees_neither_the_outcome_nor_the_metrics_of_another_users_job(job, stranger):
    stranger = api_client(stranger)
    assert stranger.get(f"/api/v1/training-jobs/{job.pk}/outcome").status_code == 404
    assert stranger.get(f"/api/v1/training-jobs/{job.pk}/metrics").status_code == 404
    assert stranger.get(f"/api/v1/training-jobs/{job.pk}/outputs").status_code == 404
