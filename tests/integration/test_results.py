"""Results that explain themselves, on the local cluster: per-rank ends and the failure card, the watchdog,
stop and auto stop leaving nothing behind, the example's loss chart, and collected outputs."""

import io
import tarfile
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.code_dirs.service import register_examples
from jobs.models import JobStatus, LauncherDefaults, Node, TrainingJob
from tests.integration.helpers import code_dir_from_program, processes_of_job_on_node, wait_for

RANKS = 4  # 2 nodes x 2 slots


def submit(api, program: str, **fields) -> TrainingJob:
    code_dir_from_program(f"results-{program.removesuffix('.py')}", program)
    body = {"name": program.removesuffix(".py"), "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 2,
            "code_dir": f"results-{program.removesuffix('.py')}", "boot_file": program, **fields}
    response = api.post("/api/v1/training-jobs", body, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


def wait_until(condition, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met after {timeout} s")
        time.sleep(0.2)


def node_of_worker(job: TrainingJob, index: int) -> str:
    return job.workers.get(index=index).node_name


def assert_nothing_left_on_any_node(job: TrainingJob, console) -> None:
    for node in console["cluster"]:
        assert processes_of_job_on_node(node, job) == [], f"processes of the job left on {node.name}"
    report = job.cleanup_report
    assert report["clean"] is True
    assert [worker["processes_left"] for worker in report["workers"]] == [0, 0]
    assert not Node.objects.filter(allocated_to__isnull=False).exists()


def test_a_rank_that_raises_gives_a_card_naming_the_exception_its_rank_and_worker(api, console):
    job = submit(api, "raise.py", parameters=[{"name": "rank", "value": "3"}])
    job = wait_for(job, [JobStatus.FAILED])

    card = api.get(f"/api/v1/training-jobs/{job.pk}/outcome").json()["failure"]
    assert card["kind"] == "exception"
    assert (card["rank"], card["worker"], card["node"]) == (3, 1, node_of_worker(job, 1))
    assert card["exception"] == "ValueError: bad batch shape on rank 3"
    assert "raise.py" in card["where"]
    assert any("Traceback" in line for line in card["last_lines"])
    assert card["how"] == "exit code 1"
    # The other ranks were blocked on rank 3 and ended by mpirun once it failed.
    assert card["others"] == [{"what": "ended by mpirun (SIGTERM) after rank 3 failed", "ranks": [0, 1, 2]}]

    ranks = {item["rank"]: item for item in api.get(f"/api/v1/training-jobs/{job.pk}/outcome").json()["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert (ranks[3]["exit_code"], ranks[3]["signal"], ranks[3]["stop_signal"]) == (1, None, "")
    assert all(ranks[rank]["stop_signal"] == "TERM" for rank in (0, 1, 2))
    assert job.exit_code == 1

    browser = Client()
    browser.force_login(job.owner)
    page = browser.get(f"/jobs/{job.pk}").content.decode()
    assert "Why it failed" in page and "ValueError: bad batch shape on rank 3" in page
    assert "Checked on every node: no process of the job is left." in page


@pytest.mark.fault("a rank SIGKILLed", "the job fails; the card names the rank and its signal")
def test_a_rank_killed_with_sigkill_is_reported_with_its_signal(api, console):
    job = submit(api, "sigkill.py", parameters=[{"name": "rank", "value": "2"}])
    job = wait_for(job, [JobStatus.FAILED])

    outcome = api.get(f"/api/v1/training-jobs/{job.pk}/outcome").json()
    card = outcome["failure"]
    assert card["kind"] == "oom"
    assert (card["rank"], card["worker"], card["signal"]) == (2, 1, 9)
    assert "SIGKILL" in card["how"]
    assert "exited on signal 9" in card["mpirun"]
    killed = next(item for item in outcome["ranks"] if item["rank"] == 2)
    assert (killed["signal"], killed["signal_name"], killed["stop_signal"]) == (9, "SIGKILL", "")


def test_a_rank_that_falls_silent_trips_the_watchdog_and_its_owner_stops_the_job(api, console):
    job = submit(api, "hang.py", parameters=[{"name": "rank", "value": "1"}], watchdog_seconds=8)
    wait_for(job, [JobStatus.RUNNING])

    hung = wait_until(lambda: api.get(f"/api/v1/training-jobs/{job.pk}/outcome").json()["suspected_hung"],
                      what="the watchdog's suspicion")
    assert [item["rank"] for item in hung["ranks"]] == [1]
    assert hung["ranks"][0]["worker"] == 0 and hung["watchdog_seconds"] == 8
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING, "without the administrator's leave the watchdog only warns"
    assert job.events.filter(kind="watchdog", message__contains="rank(s) 1 printed nothing").exists()

    assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code == 200
    job = wait_for(job, [JobStatus.TERMINATED], timeout=60)
    assert job.status_message == "Stopped by the user"
    assert job.failure == {}
    assert_nothing_left_on_any_node(job, console)


@pytest.mark.fault("a rank hung, with the watchdog allowed to stop", "the watchdog stops the job, naming the silent rank")
def test_with_the_administrators_leave_the_watchdog_stops_a_hung_job_itself(api, console):
    LauncherDefaults.objects.filter(pk=1).update(watchdog_may_stop=True)
    job = submit(api, "hang.py", parameters=[{"name": "rank", "value": "2"}], watchdog_seconds=8)
    job = wait_for(job, [JobStatus.TERMINATED], timeout=90)

    assert job.status_message.startswith("Stopped by the watchdog: rank(s) 2 printed nothing")
    assert job.failure["kind"] == "watchdog"
    assert {"what": "was silent (suspected hung), then ended by the stop (SIGTERM)", "ranks": [2]} in job.failure["others"]
    assert_nothing_left_on_any_node(job, console)


def test_a_rank_that_printed_its_last_line_and_exited_as_0_is_never_taken_as_hung(api, console):
    # Rank 1 is silent from the start, the others print for 20 s: past the watchdog's 8 s, had rank 1 not ended.
    job = submit(api, "finishes_early.py", parameters=[{"name": "rank", "value": "1"}], watchdog_seconds=8)
    job = wait_for(job, [JobStatus.COMPLETED], timeout=120)

    assert job.log_lines.filter(text="rank 1 done").exists()
    assert not job.events.filter(kind="watchdog").exists(), list(job.events.values_list("message", flat=True))
    assert (job.suspected_hung_since, job.silent_ranks) == (None, [])


@pytest.mark.fault("a rank hung, its owner having asked the watchdog to stop the job",
                   "the watchdog stops the job though the administrator's default only warns")
def test_an_owner_who_asked_for_it_has_the_watchdog_stop_their_hung_job_without_the_administrators_leave(api, console):
    LauncherDefaults.objects.filter(pk=1).update(watchdog_may_stop=False)
    job = submit(api, "hang.py", parameters=[{"name": "rank", "value": "2"}], watchdog_seconds=8,
                 watchdog_action="stop")
    job = wait_for(job, [JobStatus.TERMINATED], timeout=90)

    assert job.status_message.startswith("Stopped by the watchdog: rank(s) 2 printed nothing")
    assert job.failure["kind"] == "watchdog"


def test_auto_stop_ends_a_job_past_its_limit_and_leaves_no_process_on_any_node(api, console):
    job = submit(api, "hang.py", parameters=[{"name": "rank", "value": "-1"}], auto_stop_hours=1)
    wait_for(job, [JobStatus.RUNNING])
    wait_until(lambda: all(processes_of_job_on_node(node, job) for node in console["cluster"]), what="ranks on both nodes")
    # As if it had run for two hours: the monitor compares the job's start with its limit.
    TrainingJob.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(hours=2))
    job = wait_for(job, [JobStatus.TERMINATED], timeout=60)

    assert job.status_message == "Stopped by auto stop: the job reached its limit of 1 h"
    assert job.failure["kind"] == "auto_stop"
    assert job.events.filter(kind="state:Terminating", message__contains="auto stop").exists()
    assert_nothing_left_on_any_node(job, console)


def test_the_examples_loss_chart_has_one_point_per_step_and_its_saved_weights_download(api, console):
    register_examples()
    response = api.post("/api/v1/training-jobs", {
        "name": "gpu-train", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 2, "code_dir": "gpu-train",
        "boot_file": "train.py", "train_url": "/home/ma-user/outputs", "parameters": [{"name": "steps", "value": "5"}],
    }, format="json")
    job = wait_for(TrainingJob.objects.get(pk=response.json()["id"]), [JobStatus.COMPLETED], timeout=180)

    metrics = api.get(f"/api/v1/training-jobs/{job.pk}/metrics").json()
    loss = [point for point in metrics["points"] if point["name"] == "loss"]
    assert [point["step"] for point in loss] == [1, 2, 3, 4, 5]
    assert all(point["rank"] == 0 for point in loss)
    assert loss[-1]["value"] < loss[0]["value"]
    by_name = {metric["name"]: metric for metric in metrics["metrics"]}
    assert by_name["loss"]["count"] == 5
    assert by_name["accuracy"]["matched"] is False and by_name["accuracy"]["note"] == "No log line matched this metric."
    job.refresh_from_db()
    assert job.final_metrics == {"loss": loss[-1]["value"]}
    assert job.failure == {}

    outputs = api.get(f"/api/v1/training-jobs/{job.pk}/outputs").json()
    assert outputs["summary"]["state"] == "collected"
    weights = next(item for item in outputs["files"] if item["path"] == "weights.npy")
    download = api.get(weights["url"])
    assert download.status_code == 200
    assert b"".join(download.streaming_content).startswith(b"\x93NUMPY")


def test_outputs_over_the_limit_keep_what_fits_and_say_what_was_left_out(api, console):
    LauncherDefaults.objects.filter(pk=1).update(outputs_max_bytes=64 * 1024)
    job = submit(api, "write_output.py", train_url="/home/ma-user/outputs",
                 parameters=[{"name": "big_bytes", "value": str(200 * 1024)}])
    job = wait_for(job, [JobStatus.COMPLETED])

    outputs = api.get(f"/api/v1/training-jobs/{job.pk}/outputs").json()
    assert {item["path"]: item["kept"] for item in outputs["files"]} == {
        "big.bin": False, "checkpoints/step-1.txt": True, "result.txt": True}
    summary = outputs["summary"]
    assert (summary["state"], summary["kept_files"], summary["total_files"]) == ("partial", 2, 3)
    assert "not kept: big.bin (200.0 KB)" in summary["message"]

    result = api.get(f"/api/v1/training-jobs/{job.pk}/outputs/result.txt")
    assert b"".join(result.streaming_content) == b"trained by 4 ranks\n"
    assert api.get(f"/api/v1/training-jobs/{job.pk}/outputs/big.bin").status_code == 404
    archive = api.get(outputs["archive_url"])
    with tarfile.open(fileobj=io.BytesIO(b"".join(archive.streaming_content)), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == ["checkpoints/step-1.txt", "result.txt"]

    stranger = APIClient()
    stranger.force_authenticate(get_user_model().objects.create_user("stranger", password="stranger-password"))
    assert stranger.get(f"/api/v1/training-jobs/{job.pk}/outputs/result.txt").status_code == 404
    assert stranger.get(f"/api/v1/training-jobs/{job.pk}/outcome").status_code == 404
