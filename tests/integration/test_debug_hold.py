"""A failed job kept for a look inside, and the evidence of a failed or hung job, on the local cluster: the held
job's containers run on and its nodes stay its own until the hold ends, then both go as at any end; a failed job's
bundle holds its ranks' last lines, and a hung one's the hung rank's Python stacks (py-spy in the engine image).

The tests' worker counts a hold's minutes as seconds (DEBUG_HOLD_MINUTE_SECONDS, tests/conftest.py)."""

import time

from django.utils import timezone

from jobs.models import EvidenceBundle, JobStatus, Node, TrainingJob
from jobs.tasks import reap_orphaned_jobs
from tests.integration.helpers import code_dir_from_program, on_node, wait_for

HOLD = 20  # seconds, in the tests' worker


def submit(api, program: str, **fields) -> TrainingJob:
    code_dir_from_program(f"hold-{program.removesuffix('.py')}", program)
    body = {"name": f"hold-{program.removesuffix('.py')}", "engine": "local-mpi4py", "spec": "local-cpu",
            "node_count": 2, "code_dir": f"hold-{program.removesuffix('.py')}", "boot_file": program, **fields}
    response = api.post("/api/v1/training-jobs", body, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met after {timeout} s")
        time.sleep(0.5)
    return value


def running_containers(console, job: TrainingJob) -> list[str]:
    return [name for node in console["cluster"]
            for name in on_node(node, f"podman ps --quiet --filter label=training-console.job={job.pk} "
                                      "--format '{{.Names}}'").split()]


def test_a_failed_job_held_for_debugging_keeps_its_containers_and_nodes_until_the_hold_ends_then_frees_them(
        api, console):
    assert api.post("/api/v1/training-jobs", {"debug_hold_minutes": 100000}, format="json").json()[
        "debug_hold_minutes"], "a hold past the administrator's maximum is refused on its field"
    job = submit(api, "raise.py", parameters=[{"name": "rank", "value": "3"}], debug_hold_minutes=HOLD)
    job = wait_for(job, [JobStatus.FAILED], timeout=180)

    assert job.is_held_for_debugging, job.status_message
    assert sorted(running_containers(console, job)) == sorted(job.workers.values_list("container_name", flat=True))
    assert Node.objects.filter(allocated_to=job).count() == 2
    detail = api.get(f"/api/v1/training-jobs/{job.pk}").json()
    assert detail["held_until"] and detail["status"] == "Failed"
    bundle = wait_until(lambda: EvidenceBundle.objects.filter(job=job, reason="failure").first(), 60, "the evidence")
    last_lines = {entry["rank"]: entry["lines"] for entry in bundle.content["last_lines"]}
    assert "rank 0 ready" in last_lines[0]
    assert any("bad batch shape on rank 3" in line for line in last_lines[3])
    assert bundle.content["command"] and len(bundle.content["nodes"]) == 2
    assert [item["id"] for item in detail["evidence"]] == [bundle.pk]

    # The hold's end, as the periodic reaper finds it (a console restarted meanwhile finds it the same way).
    wait_until(lambda: timezone.now() > job.held_until, HOLD + 5, "the hold's end")
    reap_orphaned_jobs.delay()
    wait_until(lambda: not Node.objects.filter(allocated_to__isnull=False).exists(), 60, "the nodes freed")
    job.refresh_from_db()
    assert job.held_until is None and job.status == JobStatus.FAILED
    assert running_containers(console, job) == []
    assert job.cleanup_report["clean"] is True


def test_a_hung_rank_tripping_the_watchdog_gets_its_python_stacks_in_the_jobs_evidence(api, console):
    job = submit(api, "hang.py", parameters=[{"name": "rank", "value": "1"}], watchdog_seconds=8)
    wait_for(job, [JobStatus.RUNNING], timeout=180)

    bundle = wait_until(lambda: EvidenceBundle.objects.filter(job=job, reason="watchdog").first(), 90,
                        "the watchdog's evidence")
    stacks = {rank["rank"]: rank for worker in bundle.content["stacks"] for rank in worker["ranks"]}
    assert stacks[1]["ok"], stacks[1]["stack"]
    assert "hang.py" in stacks[1]["stack"], stacks[1]["stack"]
    assert set(stacks) == {0, 1, 2, 3}

    assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code == 200
    wait_for(job, [JobStatus.TERMINATED], timeout=60)
    wait_until(lambda: not Node.objects.filter(allocated_to__isnull=False).exists(), 30, "the nodes freed")
