"""Resource samples: worker-usage.sh's answer read back, and a worker's CPU share from its cgroup's CPU time."""

import asyncio
import time
from types import SimpleNamespace

import pytest

from jobs.models import ResourceSample
from jobs.runtime import resources
from jobs.runtime.containers import gpu_indices
from jobs.runtime.liveness import Probe, Usage, read_usage
from jobs.runtime.resources import ResourceRecorder


def test_a_running_containers_answer_gives_its_cpu_time_memory_and_limit():
    state, usage = read_usage("state=running\ncpu_ns=2500000000 mem=104857600 limit=4294967296\n")
    assert state == "running"
    assert usage == Usage(cpu_ns=2_500_000_000, memory_bytes=104_857_600, memory_limit_bytes=4_294_967_296)


def test_cgroup_v1s_no_limit_is_no_limit_and_gpus_are_read_where_given():
    _, usage = read_usage("state=running\ncpu_ns=1 mem=2 limit=9223372036854771712\ngpu_util=87 gpu_mem_mib=2048\n")
    assert usage.memory_limit_bytes is None
    assert (usage.gpu_percent, usage.gpu_memory_bytes) == (87.0, 2048 * 1024 * 1024)


@pytest.mark.parametrize("answer, state", [("state=gone\n", "gone"), ("state=stopped\n", "stopped"),
                                           ("state=error storage locked\n", "error storage locked"),
                                           ("something else", "error something else")])
def test_a_container_that_does_not_run_has_no_usage(answer, state):
    assert read_usage(answer) == (state, None)


def test_numbers_the_job_could_have_bent_are_read_as_nothing():
    _, usage = read_usage("state=running\ncpu_ns=² mem=-5 limit=" + "9" * 40 + "\n")
    assert usage == Usage()


def test_the_gpus_of_a_worker_are_its_cdi_names_indices():
    assert gpu_indices(("nvidia.com/gpu=0", "nvidia.com/gpu=3")) == "0,3"
    assert gpu_indices(()) == ""


@pytest.mark.django_db
def test_a_sample_is_kept_every_interval_with_the_cpu_share_since_the_last_one(make_job):
    job = make_job()
    recorder = ResourceRecorder(job.pk, every=15)
    two_cores = 2_000_000_000  # ns of CPU a second

    assert recorder.samples({0: Usage(cpu_ns=0, memory_bytes=1)}, now=100.0) == [], "the first look only starts the count"
    assert recorder.samples({0: Usage(cpu_ns=10 * two_cores, memory_bytes=1)}, now=110.0) == [], "too soon"
    [sample] = recorder.samples({0: Usage(cpu_ns=15 * two_cores, memory_bytes=5, memory_limit_bytes=9)}, now=115.0)
    assert (sample.worker_index, sample.cpu_percent, sample.memory_bytes, sample.memory_limit_bytes) == (0, 200.0, 5, 9)
    assert isinstance(sample, ResourceSample) and sample.job_id == job.pk


@pytest.mark.django_db
def test_the_owner_reads_each_workers_samples_and_a_stranger_is_told_the_job_does_not_exist(make_job, owner, stranger):
    from django.utils import timezone

    from tests.fixtures import api_client

    job = make_job(owner=owner)
    for index in (1, 0):
        ResourceSample.objects.create(job=job, worker_index=index, at=timezone.now(), cpu_percent=50.0,
                                      memory_bytes=1024, memory_limit_bytes=None)

    answer = api_client(owner).get(f"/api/v1/training-jobs/{job.pk}/resources")

    assert answer.status_code == 200
    assert [(worker["worker"], [sample["cpu_percent"] for sample in worker["samples"]])
            for worker in answer.json()["workers"]] == [(0, [50.0]), (1, [50.0])]
    assert api_client(stranger).get(f"/api/v1/training-jobs/{job.pk}/resources").status_code == 404


@pytest.mark.django_db
def test_a_page_that_polls_gets_only_the_samples_taken_since_its_last_answer(make_job, owner):
    from django.utils import timezone

    from tests.fixtures import api_client

    job = make_job(owner=owner)
    client = api_client(owner)

    def sample(cpu):
        return ResourceSample.objects.create(job=job, worker_index=0, at=timezone.now(), cpu_percent=cpu,
                                             memory_bytes=1024)

    sample(10.0)
    first = client.get(f"/api/v1/training-jobs/{job.pk}/resources").json()
    sample(20.0)
    later = client.get(f"/api/v1/training-jobs/{job.pk}/resources", {"after": first["next"]}).json()
    nothing_new = client.get(f"/api/v1/training-jobs/{job.pk}/resources", {"after": later["next"]}).json()

    assert [item["cpu_percent"] for item in first["workers"][0]["samples"]] == [10.0]
    assert [item["cpu_percent"] for item in later["workers"][0]["samples"]] == [20.0]
    assert nothing_new["workers"] == [] and nothing_new["next"] == later["next"]
    bad = client.get(f"/api/v1/training-jobs/{job.pk}/resources", {"after": "-1"})
    assert bad.status_code == 400 and bad.json() == {"after": ["A whole number, the `next` of an earlier answer."]}


class ShortJobWatch:
    """The watch of a job's two workers, on a job over before the watch's own first look: only the recorder's
    looks at the launch and at the end see the containers. Worker-1's node stops answering when `silent`."""

    def __init__(self):
        self.workers = [SimpleNamespace(index=0), SimpleNamespace(index=1)]
        self.cpu_ns = 0
        self.silent = False
        self.ran = False
        self.closed = 0

    async def probe(self, worker):
        if worker.index == 1 and self.silent:
            await asyncio.Event().wait()
        self.cpu_ns += 500_000_000
        return Probe(worker.index, running=True, usage=Usage(cpu_ns=self.cpu_ns, memory_bytes=1024 + worker.index))

    async def run(self):
        self.ran = True

    def close(self):
        self.closed += 1


@pytest.mark.django_db(transaction=True)
def test_a_job_shorter_than_the_sample_interval_gets_a_sample_at_its_start_and_one_at_its_end(make_job):
    job = make_job()
    recorder = ResourceRecorder(job.pk, every=15, start_look_seconds=0.01)
    watch = ShortJobWatch()

    async def short_job():
        await recorder.follow(watch)  # the launch's two looks, then the watch's own (none: the job is over)
        await recorder.last_look(watch)

    asyncio.run(short_job())

    kept = list(ResourceSample.objects.filter(job=job).order_by("at", "worker_index"))
    assert [sample.worker_index for sample in kept] == [0, 1, 0, 1], "a start and an end point for each worker"
    assert all(sample.cpu_percent > 0 for sample in kept)
    assert watch.ran and watch.closed == 1, "the end look closes the watch's connections"


@pytest.mark.django_db(transaction=True)
def test_the_recorders_own_look_waits_no_longer_than_one_probe_for_a_silent_node(make_job, monkeypatch):
    monkeypatch.setattr(resources, "PROBE_TIMEOUT_SECONDS", 0.2)
    job = make_job()
    recorder = ResourceRecorder(job.pk, every=15)
    watch = ShortJobWatch()
    asyncio.run(recorder.look(watch))
    watch.silent = True

    started = time.monotonic()
    asyncio.run(recorder.last_look(watch))

    assert time.monotonic() - started < 2
    assert [sample.worker_index for sample in ResourceSample.objects.filter(job=job)] == [0], "the node that answered"


def usage_answer(tmp_path, label: str, plans_gpus: str) -> tuple[str, str]:
    """worker-usage.sh's answer for a running container whose GPUs label says `label`, beside the GPUs nvidia-smi
    was asked about: podman and nvidia-smi are stand-ins on the PATH (the container's pid is this process's; podman
    warns on stderr, as a rootless one may)."""
    import os
    import subprocess

    from jobs.runtime.liveness import USAGE_SCRIPT

    tools = tmp_path / "bin"
    tools.mkdir()
    # With a warning on stderr, as a rootless Podman may print: not one of the answer's lines.
    (tools / "podman").write_text(f"#!/bin/sh\necho 'WARN[0000] a warning' >&2\n"
                                  f"printf 'true {os.getpid()}\\n\\n\\n\\n{label}\\n'\n")
    (tools / "nvidia-smi").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/asked\necho '50, 1024'\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    done = subprocess.run(["sh", "-s", "--", "job-1-worker-0", plans_gpus], input=USAGE_SCRIPT, capture_output=True,
                          text=True, env={**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}, timeout=30)
    asked = tmp_path / "asked"
    return done.stdout, asked.read_text().strip() if asked.exists() else ""


@pytest.mark.parametrize(("label", "plans", "asked"), [
    ("2,3", "0,1", "-i 2,3"),  # a Slurm step's GPUs, not the node's first ones the plan named
    ("none", "0,1", ""),
    ("", "0,1", "-i 0,1"),  # a container started before the label: the plan's
])
def test_the_watch_reads_the_gpus_the_container_says_it_was_given(tmp_path, label, plans, asked):
    answer, said = usage_answer(tmp_path, label, plans)
    assert "state=running" in answer, answer
    assert said.endswith(asked) if asked else said == "", said
    assert ("gpu_util=50 gpu_mem_mib=1024" in answer) is bool(asked), answer
