"""A failed job held for debugging, and the evidence of a failed or hung job: what is pure, and the run's end with
only SSH faked (tests/unit/test_job_run.py's FakeNodes): the job ends Failed with its nodes and containers kept,
and the end of the hold frees them as any end does."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from jobs.models import EvidenceBundle, JobStatus, LauncherDefaults, Node, TrainingJob, Worker
from jobs.results.evidence import last_lines_by_rank, masked_environment, parse_rank_stacks
from jobs.runtime import debug_hold, node_health, run
from jobs.runtime.teardown import TeardownResult
from jobs.submission.holds import release_hold
from tests.unit.log_helpers import quiet_redis  # noqa: F401
from tests.unit.test_job_run import job, nodes, run_job  # noqa: F401 - the fixtures, found by name

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("quiet_redis")]


@pytest.fixture
def evidence_asked(monkeypatch):
    """The evidence the run asks the control queue for (the queue itself is the broker's: not here)."""
    asked: list[tuple[int, str]] = []

    def queue(job_id: int, reason: str) -> bool:
        asked.append((job_id, reason))
        return False

    monkeypatch.setattr(run, "queue_evidence", queue)
    return asked


def test_a_hold_of_n_minutes_ends_n_minutes_after_it_began_in_the_settings_minutes():
    began = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert debug_hold.hold_ends_at(15, began, 60) == datetime(2026, 1, 1, 12, 15, tzinfo=UTC)
    assert debug_hold.hold_ends_at(3, began, 1) == datetime(2026, 1, 1, 12, 0, 3, tzinfo=UTC)


def test_only_a_failure_is_held_never_a_stop_or_a_success():
    assert debug_hold.is_failure("exit", 1) and debug_hold.is_failure("failed", None) and debug_hold.is_failure("abnormal", None)
    assert not debug_hold.is_failure("exit", 0) and not debug_hold.is_failure("stopped", None)


def test_py_spys_dumps_are_read_per_rank_and_a_failed_dump_says_why():
    output = ("@@ rank=0 pid=41\n| Thread 41 (idle): \"MainThread\"\n|     wait (train.py:12)\n"
              "| @@ rank=7 pid=1\n| py-spy failed: a thread's own name\n"
              "@@ rank=1 pid=42\n| Error: Permission denied (os error 13)\npy-spy failed: exit status 1\n")
    stacks = parse_rank_stacks(output)
    # A rank's own words (a thread named like a header, or like a failure) stay inside its dump.
    assert [(stack["rank"], stack["pid"], stack["ok"]) for stack in stacks] == [(0, 41, True), (1, 42, False)]
    assert "@@ rank=7 pid=1" in stacks[0]["stack"]
    assert "wait (train.py:12)" in stacks[0]["stack"]
    assert stacks[1]["stack"].endswith("py-spy failed: exit status 1")
    assert parse_rank_stacks("@@ none\n") == []


def test_each_ranks_last_lines_are_kept_in_order_and_secrets_are_masked():
    lines = [(0, "step 1"), (1, "hello"), (0, "step 2"), (0, "step 3")]
    assert last_lines_by_rank(lines, per_rank=2) == [{"rank": 0, "lines": ["step 2", "step 3"]},
                                                     {"rank": 1, "lines": ["hello"]}]
    shown = masked_environment({"API_TOKEN": "abc123secretvalue", "EPOCHS": 3})
    assert shown["EPOCHS"] == "3" and shown["API_TOKEN"] != "abc123secretvalue"


def test_a_hold_longer_than_the_administrators_maximum_is_refused_on_its_field(make_job):
    from tests.unit.test_forms import page_post

    defaults = LauncherDefaults.current()
    defaults.debug_hold_max_minutes = 30
    defaults.save()
    made = make_job()
    catalog = {"engine": made.engine_version, "spec": made.spec, "code_dir": made.code_dir}
    from jobs.submission.forms import TrainingJobForm

    form = TrainingJobForm(page_post(catalog, debug_hold_minutes="31"), user=made.owner)
    assert not form.is_valid()
    assert form.errors["debug_hold_minutes"] == [
        "The administrator allows a failed job's containers to be kept at most 30 minutes."]
    allowed = TrainingJobForm(page_post(catalog, debug_hold_minutes="30"), user=made.owner)
    allowed.is_valid()
    assert "debug_hold_minutes" not in allowed.errors


def test_a_failed_job_with_a_hold_ends_failed_keeping_its_nodes_and_containers_then_the_hold_frees_them(
        nodes, job, evidence_asked, monkeypatch):  # noqa: F811
    TrainingJob.objects.filter(pk=job.pk).update(debug_hold_minutes=5)
    nodes.exit_status = 3

    job = run_job(job)

    assert job.status == JobStatus.FAILED and job.is_held_for_debugging
    assert timedelta(minutes=4) < job.held_until - timezone.now() <= timedelta(minutes=5)
    assert nodes.teardowns == [], "the containers stay for the hold"
    assert set(Node.objects.values_list("allocated_to", flat=True)) == {job.pk}
    assert evidence_asked == [(job.pk, "failure")]
    assert debug_hold.expired_holds() == [] and not debug_hold.end_hold(job.pk), "a hold that lasts is not ended"
    # A node check meanwhile does not take the held job's containers for leftovers.
    worker = Worker.objects.get(job=job, index=0)
    facts = {"containers": [{"name": worker.container_name, "state": "running"}]}
    assert node_health.leftover_names(facts, worker.node_id) == []
    # Neither a delete nor a force release of one of its nodes frees nodes its containers still use.
    from django.test import Client

    from jobs.models import IllegalTransition
    from jobs.submission.force_release import force_release_node

    client = Client()
    client.force_login(job.owner)
    assert client.post(f"/jobs/{job.pk}/delete").status_code == 302 and TrainingJob.objects.filter(pk=job.pk).exists()
    with pytest.raises(IllegalTransition, match="holds it for debugging"):
        force_release_node(worker.node, job.owner)
    assert set(Node.objects.values_list("allocated_to", flat=True)) == {job.pk}

    TrainingJob.objects.filter(pk=job.pk).update(held_until=timezone.now() - timedelta(seconds=1))
    torn_down: list[list[int]] = []

    async def teardown_all(workers):
        torn_down.append([worker.index for worker in workers])
        return [TeardownResult(worker.index, 0) for worker in workers]

    monkeypatch.setattr(debug_hold, "teardown_all", teardown_all)
    assert debug_hold.expired_holds() == [job.pk]
    assert debug_hold.end_hold(job.pk)

    job.refresh_from_db()
    assert torn_down == [[0, 1]]
    assert job.status == JobStatus.FAILED and job.held_until is None and not job.is_held_for_debugging
    assert sorted(job.workers.values_list("state", "message")) == [
        ("Stopped", "worker-0: container removed, no process left"),
        ("Stopped", "worker-1: container removed, no process left")]
    assert not Node.objects.filter(allocated_to__isnull=False).exists()
    assert node_health.leftover_names(facts, worker.node_id) == [worker.container_name]
    assert debug_hold.expired_holds() == []
    assert client.post(f"/jobs/{job.pk}/delete").status_code == 302 and not TrainingJob.objects.filter(pk=job.pk).exists()


def test_a_held_jobs_container_on_a_node_it_no_longer_holds_is_a_leftover(nodes, job, evidence_asked):  # noqa: F811
    TrainingJob.objects.filter(pk=job.pk).update(debug_hold_minutes=5)
    nodes.exit_status = 3
    job = run_job(job)
    worker = Worker.objects.get(job=job, index=0)
    Node.objects.filter(pk=worker.node_id).update(allocated_to=None)
    facts = {"containers": [{"name": worker.container_name, "state": "running"}]}
    assert node_health.leftover_names(facts, worker.node_id) == [worker.container_name]


def test_a_job_without_a_hold_or_that_succeeds_is_torn_down_at_once(nodes, job, evidence_asked):  # noqa: F811
    nodes.exit_status = 0
    TrainingJob.objects.filter(pk=job.pk).update(debug_hold_minutes=5)

    job = run_job(job)

    assert job.status == JobStatus.COMPLETED and job.held_until is None
    assert nodes.teardowns == [[0, 1]] and evidence_asked == []
    assert not Node.objects.filter(allocated_to__isnull=False).exists()


def test_release_now_is_the_owners_and_ends_the_hold_at_once(make_job, owner, stranger, monkeypatch):
    queued: list[int] = []
    monkeypatch.setattr("jobs.submission.holds.end_hold_soon", queued.append)
    held = make_job(owner=owner, status=JobStatus.FAILED, debug_hold_minutes=10,
                    held_until=timezone.now() + timedelta(minutes=10))

    assert not release_hold(stranger, held.pk)
    assert TrainingJob.objects.get(pk=held.pk).is_held_for_debugging and queued == []
    assert release_hold(owner, held.pk)
    assert not TrainingJob.objects.get(pk=held.pk).is_held_for_debugging and queued == [held.pk]
    assert debug_hold.expired_holds() == [held.pk], "the reaper's look ends it too, should the queue lose it"
    assert not release_hold(owner, held.pk), "released once"


def test_the_api_shows_a_jobs_evidence_to_its_owner_only(make_job, owner, stranger):
    from rest_framework.test import APIClient

    failed = make_job(owner=owner, status=JobStatus.FAILED)
    bundle = EvidenceBundle.objects.create(job=failed, attempt=1, reason="failure", content={"command": "x"})
    client = APIClient()
    client.force_authenticate(owner)
    detail = client.get(f"/api/v1/training-jobs/{failed.pk}").json()
    assert [item["id"] for item in detail["evidence"]] == [bundle.pk] and detail["held_until"] is None
    assert client.get(f"/api/v1/training-jobs/{failed.pk}/evidence/{bundle.pk}").json() == {"command": "x"}
    client.force_authenticate(stranger)
    assert client.get(f"/api/v1/training-jobs/{failed.pk}/evidence/{bundle.pk}").status_code == 404


def test_a_held_jobs_page_says_so_with_release_now_and_its_evidence_and_the_capacity_page_says_its_nodes_are_held(
        make_job, owner, stranger, client):
    from django.test import Client

    from tests.fixtures import add_nodes, cpu_spec

    until = timezone.now() + timedelta(minutes=10)
    held = make_job(owner=owner, status=JobStatus.FAILED, debug_hold_minutes=10, held_until=until)
    Node.objects.filter(pk__in=[node.pk for node in add_nodes(cpu_spec(), 2)]).update(allocated_to=held)
    bundle = EvidenceBundle.objects.create(job=held, attempt=1, reason="failure", content={})
    client.force_login(owner)
    page = client.get(f"/jobs/{held.pk}").content.decode()
    assert "Held for debugging" in page and "Release now" in page
    assert f"/jobs/{held.pk}/evidence/{bundle.pk}.json" in page
    capacity = client.get("/capacity").content.decode()
    # In the browser's own time zone, as every time of the pages (the script writes it from the datetime).
    shown = f'held for debugging until <time datetime="{until.isoformat()}">{timezone.localtime(until):%Y-%m-%d %H:%M:%S}</time>'
    assert shown in capacity
    others = Client()
    others.force_login(stranger)
    assert shown in others.get("/capacity").content.decode()
    assert others.get(f"/jobs/{held.pk}/evidence/{bundle.pk}.json").status_code == 404


def test_tc_submit_takes_a_hold_in_minutes():
    from training_console_cli.main import parser

    assert parser().parse_args(["submit", "--debug-hold-minutes", "15"]).debug_hold_minutes == 15


def test_the_stacks_script_keeps_to_its_budget_however_many_ranks_hang(tmp_path):
    """rank-stacks.sh against real processes of this machine and a py-spy that never answers: it ends within
    its budget (and the kill's grace), each rank said, those left without time said so."""
    import os
    import subprocess
    import sys
    import time

    from jobs.runtime.evidence import STACKS_SCRIPT

    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, "OMPI_COMM_WORLD_RANK": str(rank)}) for rank in range(4)]
    try:
        time.sleep(0.5)
        started = time.monotonic()
        done = subprocess.run(["sh", "-s", "--", "3"], input=STACKS_SCRIPT, capture_output=True, text=True,
                              env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}, timeout=30)
        took = time.monotonic() - started
    finally:
        for rank in ranks:
            rank.kill()
    stacks = [stack for stack in parse_rank_stacks(done.stdout) if stack["pid"] in {rank.pid for rank in ranks}]
    assert sorted(stack["rank"] for stack in stacks) == [0, 1, 2, 3]
    assert not any(stack["ok"] for stack in stacks)
    assert any("no time left" in stack["stack"] for stack in stacks)
    assert took < 3 + 2 + 2, f"the script took {took:.1f} s for a budget of 3 s"


def test_an_administrator_ends_a_hold_early_from_the_admin_and_the_jobs_events_say_who(make_job, owner, monkeypatch):
    from django.test import Client

    from tests.fixtures import person

    queued: list[int] = []
    monkeypatch.setattr("jobs.submission.holds.end_hold_soon", queued.append)
    held = make_job(owner=owner, status=JobStatus.FAILED, debug_hold_minutes=10,
                    held_until=timezone.now() + timedelta(minutes=10))
    ended = make_job(owner=owner, status=JobStatus.FAILED)
    admin = Client()
    admin.force_login(person("hold-admin", is_staff=True, is_superuser=True))

    answer = admin.post("/admin/jobs/trainingjob/", {"action": "end_debug_holds",
                                                     "_selected_action": [str(held.pk), str(ended.pk)]}, follow=True)

    assert answer.status_code == 200
    page = answer.content.decode()
    assert "Hold ended for 1 job(s)" in page and "The other selected jobs were not held." in page
    assert queued == [held.pk] and not TrainingJob.objects.get(pk=held.pk).is_held_for_debugging
    assert held.events.filter(kind="debug-hold", message="Ended early by the administrator hold-admin").exists()


def test_deleting_a_job_whose_hold_has_just_ended_says_to_wait_not_to_release_it(make_job, owner, client):
    held = make_job(owner=owner, status=JobStatus.FAILED, debug_hold_minutes=10,
                    held_until=timezone.now() + timedelta(minutes=10))
    over = make_job(owner=owner, status=JobStatus.FAILED, debug_hold_minutes=10,
                    held_until=timezone.now() - timedelta(seconds=5))
    client.force_login(owner)

    still_held = client.post(f"/jobs/{held.pk}/delete", follow=True).content.decode()
    ending = client.post(f"/jobs/{over.pk}/delete", follow=True).content.decode()

    assert "is held for debugging: release it first" in still_held
    assert "hold for debugging has ended and its containers are being removed" in ending
    assert "release it first" not in ending
    assert TrainingJob.objects.filter(pk__in=[held.pk, over.pk]).count() == 2


def test_a_held_job_past_its_disk_limit_has_its_hold_ended_at_once_saying_which_worker(
        nodes, job, evidence_asked, monkeypatch):  # noqa: F811
    from jobs.runtime.liveness import Probe, WorkerWatch

    TrainingJob.objects.filter(pk=job.pk).update(debug_hold_minutes=30)
    nodes.exit_status = 3
    job = run_job(job)
    assert job.is_held_for_debugging and debug_hold.held_jobs() == [job.pk]
    over = {1: "passed its disk limit of 1.00 GiB: its home and its container's own files hold 4.00 GiB"}

    async def probe(self, worker):  # the SSH boundary: worker-usage.sh's answer, read
        return Probe(worker.index, running=True, over_limit=over.get(worker.index, ""))

    monkeypatch.setattr(WorkerWatch, "probe", probe)
    over_now = dict(over)
    over.clear()
    assert debug_hold.check_held_disk(job.pk) == "", "within its limit, the hold goes on"
    assert TrainingJob.objects.get(pk=job.pk).is_held_for_debugging
    over.update(over_now)

    said = debug_hold.check_held_disk(job.pk)

    assert said == f"The hold ended early: worker-1 {over[1]}"
    job.refresh_from_db()
    assert job.held_until is not None and job.held_until <= timezone.now()
    assert debug_hold.expired_holds() == [job.pk] and debug_hold.held_jobs() == []
    assert job.events.filter(kind="debug-hold", message=said).exists()
