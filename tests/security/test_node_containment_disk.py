"""A job cannot fill its node's disk: a worker that writes past its spec's disk limit, in its home or inside its
container, is ended at the worker watch's next look, the card says "disk limit", and the node stays Ready."""

import re

import pytest

from jobs.models import JobStatus, Node, ResourceSpec
from tests.integration.helpers import submit_program, wait_for
from tests.security.containment import job_containers, nodes_free_and_ready

GIB = 1024**3
# The writer's target: four times the limit, so that a watch that never stops it lets the job complete.
TARGET_MB = 4096
CHUNK = 64 * 1024 * 1024  # what attack_disk_fill.py writes between two of its lines
WRITTEN = re.compile(r"^FILL wrote=(\d+) at=([\d.]+)$")


@pytest.mark.attack("a job writes 4 GiB past a 1 GiB disk limit, in its home and in its container's /tmp",
                    "the writer is stopped; the card says disk limit; the node stays Ready")
@pytest.mark.parametrize("path", ["~/fill", "/tmp/fill"], ids=["home", "writable-layer"])
def test_a_worker_writing_past_its_disk_limit_is_stopped_with_a_disk_limit_card(api, console, path):
    small_disk = ResourceSpec.objects.create(name="local-disk-1g", cpu_cores=2, memory_gb=4, cpu_slots_per_node=2,
                                             disk_gb=1)
    Node.objects.update(spec=small_disk)
    job = submit_program(api, "attack_disk_fill.py", spec="local-disk-1g", parameters=[
        {"name": "path", "value": path}, {"name": "target_mb", "value": str(TARGET_MB)}])

    job = wait_for(job, [JobStatus.FAILED], timeout=240)
    card = job.failure
    assert card["kind"] == "disk_limit" and "disk limit" in card["title"], card
    assert card["title"].startswith("worker-0 ") and "it passed its disk limit of 1.00 GiB" in card["hints"][0], card
    assert "disk limit" in job.status_message

    # How far the writer got, and how long it went on past the limit (from its own lines' times).
    progress = [(int(match[1]), float(match[2])) for line in job.log_lines.filter(rank=0).order_by("seq")
                if (match := WRITTEN.match(line.text))]
    # Stopped while it still wrote: it never got to say it was done (at its target it writes on for two minutes,
    # as a disk faster than the watch may let it get there).
    assert progress and not job.log_lines.filter(text__startswith="FILL done").exists(), "the writer was never stopped"
    # Stopped for the limit, not before it: the writer had got to it (a line is printed after each chunk, so
    # the chunk written after the last line may be what took it over).
    assert progress[-1][0] + CHUNK > GIB, progress[-1]
    crossed = next(at for written, at in progress if written + CHUNK > GIB)
    assert job.ended_at is not None
    print(f"\ndisk limit ({path}): the writer's last line said {progress[-1][0] / GIB:.2f} GiB against a 1 GiB limit "
          f"(at most one 64 MiB chunk more), {progress[-1][1] - crossed:.1f} s after the chunk that took it past the "
          f"limit began; the job ended {job.ended_at.timestamp() - crossed:.1f} s after that")
    # The watch looks every WORKER_PROBE_SECONDS (2 s in the tests): a few looks and the teardown, at most.
    assert job.ended_at.timestamp() - crossed < 30

    # Nothing of the job is left on any node, and every node is Ready and free again.
    assert [job_containers(node, job) for node in console["cluster"]] == ["", ""]
    assert nodes_free_and_ready() == [(node.name, Node.State.READY, None) for node in console["nodes"]]
