"""No lost work: the checkpoint contract on the local cluster, in real containers, with a real object store.

A stop with a notice leaves a checkpoint written after it, and goes on as soon as that checkpoint is in the
store; a program that ignores the notice is ended when the grace runs out, no later, and a manifest that
points outside its folder is warned of and never trusted; an auto restart after a worker's container was
killed resumes from the last checkpoint and ends with the same weights as a run that was never interrupted,
and the work the first attempt lost is what it really lost.
"""

import asyncio
import re
import time
from datetime import datetime

import pytest
from django.conf import settings

from jobs.code_dirs.service import register
from jobs.management.commands.localstore import register as register_store
from jobs.models import Checkpoint, JobStatus
from jobs.object_store.client import ObjectStore
from tests.integration.helpers import _node_run, log_text, submit_program, wait_for
from tests.integration.test_faults import every_node_free_and_ready, local_node, worker_of

pytestmark = pytest.mark.django_db(transaction=True)

CHECKSUM = re.compile(r"rank 0 final weights checksum (\S+)")


@pytest.fixture
def bucket(console, object_store, owner):
    storage = register_store(object_store.endpoint, object_store.state)
    name = storage.user_bucket(owner.pk, owner.username)
    ObjectStore(storage.access()).create_bucket(name)
    return storage, name


def submit_example(api, bucket_name: str, run: str, steps: int, **fields):
    register("gpu-train", settings.EXAMPLES_DIR / "gpu-train", sharing="everyone")
    parameters = [{"name": "steps", "value": str(steps)}, *fields.pop("parameters", [])]
    response = api.post("/api/v1/training-jobs", {
        "name": run, "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 2, "code_dir": "gpu-train",
        "boot_file": "train.py", "train_url": f"obs://{bucket_name}/runs/{run}/", "parameters": parameters,
        **fields}, format="json")
    assert response.status_code == 201, response.content
    from jobs.models import TrainingJob

    return TrainingJob.objects.get(pk=response.json()["id"])


def wait_until(condition, timeout: float, what: str, job=None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}:\n{log_text(job) if job else ''}"
        time.sleep(0.3)


def test_a_stop_with_a_grace_leaves_a_checkpoint_written_after_the_notice_and_does_not_wait_out_the_grace(
        api, bucket):
    storage, name = bucket
    job = submit_example(api, name, "noticed", steps=100000, checkpoint_grace_seconds=20, parameters=[
        {"name": "step_seconds", "value": "0.2"}, {"name": "checkpoint_every", "value": "100000"}])
    wait_for(job, [JobStatus.RUNNING], timeout=240)
    wait_until(lambda: "step=5 " in log_text(job), 120, "the example did not get to step 5", job)
    assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code in (200, 202)
    job = wait_for(job, [JobStatus.TERMINATED], timeout=120)

    notices = list(job.events.filter(kind="notice"))
    assert len(notices) == 1, [(event.kind, event.message) for event in job.events.all()]
    notice = notices[0]
    assert re.fullmatch(r"Notice: SIGUSR1 sent to 4 rank\(s\); up to 20 s to save a checkpoint", notice.message)
    checkpoint = Checkpoint.objects.get(job=job)
    assert checkpoint.step >= 5 and checkpoint.after_notice_seconds is not None
    assert 0 <= checkpoint.after_notice_seconds < 20
    assert f"saved {checkpoint.after_notice_seconds:.0f} s after the notice" in job.events.get(kind="checkpoint").message
    keys = {item.key for item in ObjectStore(storage.access()).objects(name, "runs/noticed/checkpoints/", 100)}
    assert f"runs/noticed/checkpoints/step-{checkpoint.step}.npz" in keys, keys
    # The stop went on once the checkpoint was in the store, not at the end of the grace.
    assert (job.ended_at - notice.at).total_seconds() < 20, (notice.at, job.ended_at)
    [attempt] = job.attempts.all()
    assert attempt.last_checkpoint_step == checkpoint.step and attempt.lost_seconds < 20
    assert every_node_free_and_ready()


def test_a_program_that_ignores_the_notice_is_ended_at_the_end_of_the_grace_and_its_untrusted_manifest_is_ignored(
        api, bucket):
    _, name = bucket
    job = submit_program(api, "ignores_notice.py", train_url=f"obs://{name}/runs/ignores/", checkpoint_grace_seconds=6)
    wait_for(job, [JobStatus.RUNNING], timeout=240)
    wait_until(lambda: job.log_lines.filter(text__startswith="tick rank=3").exists(), 120, "no tick", job)
    wait_until(lambda: job.events.filter(kind="checkpoint-ignored").exists(), 30, "the manifest was not looked at", job)
    assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code in (200, 202)
    job = wait_for(job, [JobStatus.TERMINATED], timeout=120)

    notice = job.events.get(kind="notice").at.timestamp()
    ticks = [float(line.text.rsplit("at=", 1)[1]) for line in job.log_lines.filter(text__startswith="tick rank=")]
    carried_on = job.log_lines.filter(text__contains="carries on").count()
    assert carried_on == 4, log_text(job)
    # The ranks ran through the grace, and not past it (a second's leeway for the ranks' last prints).
    assert max(ticks) > notice + 5, (notice, max(ticks))
    assert max(ticks) < notice + 6 + 2, (notice, max(ticks))
    assert "No checkpoint within the 6 s grace: ending the ranks" in log_text(job)
    warning = job.events.filter(kind="checkpoint-ignored").first()
    assert warning is not None and "is not inside" in warning.message
    assert not Checkpoint.objects.filter(job=job).exists()
    [attempt] = job.attempts.all()
    assert attempt.last_checkpoint_step is None  # the whole attempt was lost
    assert every_node_free_and_ready()


@pytest.mark.fault("a worker's container killed mid-run, with auto restart and checkpoints",
                   "attempt 2 resumes from the last checkpoint in the store and ends with an uninterrupted run's weights")
def test_an_auto_restart_after_a_lost_worker_resumes_from_the_last_checkpoint_with_the_weights_of_an_uninterrupted_run(
        api, bucket, console):
    _, name = bucket
    uninterrupted = submit_example(api, name, "straight", steps=60)
    uninterrupted = wait_for(uninterrupted, [JobStatus.COMPLETED], timeout=240)
    expected = CHECKSUM.search(log_text(uninterrupted))
    assert expected, log_text(uninterrupted)

    job = submit_example(api, name, "interrupted", steps=60, max_restarts=1, parameters=[
        {"name": "step_seconds", "value": "0.25"}, {"name": "checkpoint_every", "value": "5"}])
    wait_for(job, [JobStatus.RUNNING], timeout=240)
    wait_until(lambda: Checkpoint.objects.filter(job=job, step__gte=15).exists(), 120, "no checkpoint at step 15", job)
    worker = worker_of(job, 1)
    asyncio.run(_node_run(local_node(console, worker.node_name), f"podman kill {worker.container_name}"))
    killed_at = time.time()

    job = wait_for(job, [JobStatus.COMPLETED], timeout=300)
    assert job.restart_count == 1
    [boundary] = job.attempt_log_starts
    second = "\n".join(line.text for line in job.log_lines.filter(seq__gt=boundary))
    resumed = re.search(r"resumed from /home/ma-user/modelarts/outputs/train_url_0/checkpoints/step-(\d+)\.npz "
                        r"after step (\d+)", second)
    assert resumed and int(resumed.group(1)) >= 15, second
    assert "step=1 " not in second
    assert CHECKSUM.search(second).group(1) == expected.group(1)

    first_attempt = job.attempts.get(number=1)
    last = Checkpoint.objects.filter(job=job, attempt=1).order_by("-saved_at").first()
    assert first_attempt.last_checkpoint_step == last.step == int(resumed.group(1))
    # The truth: from the program's own time of that checkpoint to the attempt's end. The figure counts from
    # when the checkpoint was in the store: later by at most one look for it (CHECKPOINT_LOOK_SECONDS) and
    # its upload, well within one checkpoint interval of the program's (5 steps of 0.25 s) and that look.
    saved = datetime.fromisoformat(last.program_time).timestamp()
    truth = first_attempt.ended_at.timestamp() - saved
    assert 0 <= truth - first_attempt.lost_seconds <= 5 * 0.25 + settings.CHECKPOINT_LOOK_SECONDS + 2, \
        (first_attempt.lost_seconds, truth)
    assert first_attempt.ended_at.timestamp() > killed_at
    assert every_node_free_and_ready()
