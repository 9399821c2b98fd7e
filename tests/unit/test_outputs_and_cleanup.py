"""Outputs kept within the limit and said so, the limit the job was created with; the teardown's report per node,
which a job's own words cannot fake."""

from jobs.models import LauncherDefaults, TrainingJob
from jobs.results.outputs import FoundFile, choose_kept, container_path, describe
from jobs.runtime.run import outputs_request
from jobs.runtime.teardown import LEFT_LINE, TeardownResult, cleanup_report
from tests.fixtures import job_body


def test_files_are_kept_in_path_order_while_they_fit_and_a_large_one_is_passed_over():
    files = [FoundFile("a.txt", 10), FoundFile("b.bin", 1000), FoundFile("c/d.txt", 20)]
    kept = choose_kept(files, 100)
    assert kept == {"a.txt", "c/d.txt"}
    state, message = describe(files, kept, 100)
    assert state == "partial"
    assert "not kept: b.bin (1000 bytes)" in message and "kept 2 file(s), 30 bytes" in message


def test_all_files_within_the_limit_are_collected():
    files = [FoundFile("model.pt", 5)]
    assert describe(files, choose_kept(files, 5), 5) == ("collected", "Collected 1 file(s), 5 bytes.")
    assert describe([], set(), 5)[0] == "empty"


def test_an_admin_change_of_the_outputs_limit_after_a_submission_leaves_that_jobs_limit_as_it_was(
        api, catalogue, admin_client):
    LauncherDefaults.objects.update_or_create(pk=1, defaults={"outputs_max_bytes": 64 * 1024})
    submitted = api.post("/api/v1/training-jobs", job_body(train_url="/home/ma-user/outputs"), format="json")
    assert submitted.status_code == 201, submitted.content
    job = TrainingJob.objects.get(pk=submitted.json()["id"])

    defaults = LauncherDefaults.current()
    form = {"bind_args": defaults.bind_args, "x_args": defaults.x_args, "mca_args": defaults.mca_args,
            "tune_prefixes": defaults.tune_prefixes, "sshd_port_min": defaults.sshd_port_min,
            "sshd_port_max": defaults.sshd_port_max, "log_cap_bytes": defaults.log_cap_bytes,
            "watchdog_seconds": defaults.watchdog_seconds, "outputs_max_bytes": 10 * 1024**3,
            "checkpoint_grace_max_seconds": 900, "debug_hold_max_minutes": 90, "_save": "Save"}
    changed = admin_client.post(f"/admin/jobs/launcherdefaults/{defaults.pk}/change/", form)
    assert changed.status_code == 302, changed.content.decode()
    assert LauncherDefaults.current().outputs_max_bytes == 10 * 1024**3
    # The maximums the form tells users of are the administrator's to change too.
    assert (LauncherDefaults.current().checkpoint_grace_max_seconds, LauncherDefaults.current().debug_hold_max_minutes) == (
        900, 90)

    train_url, _path, limit, _ran_to_end = outputs_request(job.pk, "/home/ma-user/user-job-dir/code")
    assert (train_url, limit) == ("/home/ma-user/outputs", 64 * 1024), "the job keeps the limit it was created with"
    later = api.post("/api/v1/training-jobs", job_body(name="train-2"), format="json")
    assert TrainingJob.objects.get(pk=later.json()["id"]).outputs_limit() == 10 * 1024**3, "a new job takes the new one"


def test_train_url_is_taken_as_the_container_sees_it():
    assert container_path("/home/ma-user/out/", "/home/ma-user/user-job-dir/code") == "/home/ma-user/out"
    assert container_path("out", "/home/ma-user/user-job-dir/code") == "/home/ma-user/user-job-dir/code/out"
    assert container_path("obs://bucket/out", "/x") is None


def test_only_the_stop_scripts_own_last_line_counts_what_is_left():
    # A rank record (the job user's file) cannot pass for the script's count.
    assert LEFT_LINE.match("rank-record rank=1 ended=1 left=0") is None
    assert LEFT_LINE.match("left=2").group(1) == "2"


def test_the_cleanup_report_says_what_each_node_kept():
    report = cleanup_report([TeardownResult(1, 2), TeardownResult(0, 0)], {0: "node-a", 1: "node-b"})
    assert report["clean"] is False
    assert report["workers"] == [
        {"worker": 0, "node": "node-a", "clean": True, "processes_left": 0, "problem": ""},
        {"worker": 1, "node": "node-b", "clean": False, "processes_left": 2, "problem": "2 process(es) could not be ended"},
    ]
