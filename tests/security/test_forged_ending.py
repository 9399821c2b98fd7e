"""A job that forges how it ended, on the real 2-node local cluster.

Before, mpirun's output, pid and exit files and the rank records were all in the job's writable home:
a job wrote exit 0, killed mpirun's wrapper and ended Completed while its ranks still ran, and printed
lines tagged as another rank, or as the platform's, that the log and the card took for theirs. Now the
wrapper runs outside the container as the node's root, its files in a root-owned run folder; mpirun,
and the filter between each rank and Open MPI, run from sealed (unreadable, hence non-dumpable)
programs; and only the console's own lines carry the platform's mark.
"""

import time

import pytest

from jobs.logs.store import SERVICE_LOG_PREFIX, render_text
from jobs.models import CodeDirectory, JobStatus, LogStream, TrainingJob
from tests.integration.helpers import CLUSTER_NODES, CLUSTER_SLOTS, code_dir_from_program, log_text, wait_for

CODE_DIR = "attack-forged-ending"
RANKS = CLUSTER_NODES * CLUSTER_SLOTS


@pytest.fixture
def attack_dir(console, owner):
    code_dir = code_dir_from_program(CODE_DIR, "attack_forged_ending.py")
    CodeDirectory.objects.filter(pk=code_dir.pk).update(owner=owner)
    return code_dir


def submit(api, mode: str) -> TrainingJob:
    body = {"name": "forger", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": CLUSTER_NODES,
            "code_dir": CODE_DIR, "boot_file": "attack_forged_ending.py",
            "parameters": [{"name": "mode", "value": mode}]}
    response = api.post("/api/v1/training-jobs", body, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


def wait_for_line(job: TrainingJob, text: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not job.log_lines.filter(text=text).exists():
        job.refresh_from_db()
        assert job.status in (JobStatus.PENDING, JobStatus.CREATING, JobStatus.RUNNING), \
            f"the job ended {job.status} ({job.status_message}) before {text!r}:\n{log_text(job)}"
        assert time.monotonic() < deadline, f"no {text!r} after {timeout} s:\n{log_text(job)}"
        time.sleep(0.3)


def assert_forged_lines_are_rank_0s_own(job: TrainingJob) -> None:
    """Every line holding a forgery is rank 0's (the forger's), shown as rank 0's, never as the platform's."""
    forged = list(job.log_lines.filter(text__contains="FORGED").order_by("seq"))
    texts = log_text(job)
    for attempt in ("FORGED-TAG-AT-START", "FORGED-TAG-MID-LINE", "FORGED-TAG-ON-STDERR", "FORGED-PLATFORM"):
        assert any(attempt in line.text for line in forged), f"{attempt} is not in the log:\n{texts}"
    for line in forged:
        assert line.rank == 0 and line.stream != LogStream.SYSTEM, f"a forged line passed for another source:\n{texts}"
        assert render_text(line.stream, line.rank, line.text).startswith("[rank 0] "), line.text
    assert not job.log_lines.filter(text__contains="FORGED-DIRECT").exists(), f"written beside mpirun:\n{texts}"
    assert job.log_lines.filter(text__startswith="ATTACK could not write into mpirun's fd 1").exists(), texts
    platform = [render_text(line.stream, line.rank, line.text) for line in job.log_lines.order_by("seq")]
    assert not [text for text in platform if text.startswith(SERVICE_LOG_PREFIX) and "FORGED" in text], platform


@pytest.mark.attack("a job writes exit 0 and fake rank records, kills mpirun's wrapper, then runs on",
                    "the job is not Completed: it runs on until stopped, then Terminated")
def test_a_job_that_forges_exit_0_and_kills_the_wrapper_does_not_end_completed(api, attack_dir):
    job = submit(api, "keep_running")
    wait_for_line(job, "ATTACK done")
    assert job.log_lines.filter(text="ATTACK wrote exit 0 and a record of exit 0 for every rank").exists()
    assert job.log_lines.filter(text="ATTACK killed 0 wrapper process(es)").exists(), log_text(job)
    # The old follow saw a forged end within a second of it; give it ample time to be fooled.
    time.sleep(8)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING, f"{job.status} ({job.status_message}):\n{log_text(job)}"

    assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code == 200
    job = wait_for(job, [JobStatus.TERMINATED], timeout=90)
    assert_forged_lines_are_rank_0s_own(job)


@pytest.mark.attack("a job forges exit 0, rank records and other ranks' and the platform's lines, then a rank exits 3",
                    "Failed with mpirun's exit 3, the card names rank 1; forged lines stay rank 0's")
def test_a_job_that_forges_its_ending_and_fails_ends_failed_as_mpirun_says(api, attack_dir):
    job = submit(api, "fail")
    job = wait_for(job, [JobStatus.FAILED], timeout=240)

    assert job.exit_code == 3, f"{job.exit_code} {job.status_message}:\n{log_text(job)}"
    assert job.failure["rank"] == 1, job.failure
    assert "exit code 3" in job.failure["title"] or job.failure["exit_code"] == 3, job.failure
    assert_forged_lines_are_rank_0s_own(job)


@pytest.mark.attack("a failing rank's record claims exit 0 or another signal than mpirun saw",
                    "the card tells mpirun's exit code and signal for the rank it names")
def test_a_forged_rank_record_cannot_change_what_the_card_says_of_the_rank_mpirun_names():
    from jobs.results.failure_card import explain_failure
    from jobs.results.rank_records import RankRecord
    from tests.unit.test_outcome import KILLED, NON_ZERO_EXIT, facts

    exited = explain_failure(facts(mpirun_lines=NON_ZERO_EXIT, records={3: RankRecord(3, 1.0, 0, None)}))
    killed = explain_failure(facts(exit_code=137, mpirun_lines=KILLED, records={1: RankRecord(1, 1.0, 0, None)}))

    assert (exited["rank"], exited["exit_code"], exited["how"]) == (3, 1, "exit code 1")
    assert (killed["rank"], killed["signal"], killed["kind"]) == (1, 9, "oom")
