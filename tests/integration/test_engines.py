"""The Horovod and MindSpore engines for real: their shipped images, their examples on 2 nodes x 2 slots."""

import re

import pytest

from jobs.code_dirs.service import register_examples
from jobs.images.recipes import HOROVOD, MINDSPORE
from jobs.models import Engine, EngineVersion, JobStatus, TrainingJob
from tests.integration.helpers import CLUSTER_NODES, CLUSTER_SLOTS, rank_lines, wait_for

RANKS = CLUSTER_NODES * CLUSTER_SLOTS


def submit(api, engine: str, code_dir: str, **fields) -> TrainingJob:
    body = {"name": code_dir, "engine": engine, "spec": "local-cpu", "node_count": CLUSTER_NODES,
            "code_dir": code_dir, "boot_file": "train.py", **fields}
    response = api.post("/api/v1/training-jobs", body, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


@pytest.fixture
def horovod(console, horovod_image):
    engine = Engine.objects.create(name="Horovod")
    register_examples()
    return EngineVersion.objects.create(engine=engine, version=HOROVOD.version, image=horovod_image, python=HOROVOD.python)


@pytest.fixture
def mindspore(console, mindspore_image):
    engine = Engine.objects.create(name="MindSpore-GPU")
    register_examples()
    return EngineVersion.objects.create(engine=engine, version=MINDSPORE.version, image=mindspore_image,
                                        python=MINDSPORE.python)


def per_rank(job: TrainingJob, pattern: str) -> dict[int, list[re.Match]]:
    found: dict[int, list[re.Match]] = {}
    for line in rank_lines(job):
        match = re.search(pattern, line.text)
        if match:
            found.setdefault(line.rank, []).append(match)
    return found


def hosts_of(job: TrainingJob) -> set[str]:
    return {f"{job.dns_name}-worker-{index}" for index in range(CLUSTER_NODES)}


def test_the_horovod_example_trains_on_two_nodes_and_its_ranks_agree(api, horovod):
    steps = 5
    job = submit(api, horovod.version, "horovod-train", parameters=[{"name": "steps", "value": str(steps)}])
    job = wait_for(job, [JobStatus.COMPLETED], timeout=300)

    assert job.exit_code == 0
    banners = per_rank(job, r"on host (\S+) horovod size=(\d+) local_size=(\d+) cross_size=(\d+)")
    assert sorted(banners) == list(range(RANKS))
    assert {matches[0].group(1) for matches in banners.values()} == hosts_of(job)
    assert {matches[0].groups()[1:] for matches in banners.values()} == {(str(RANKS), str(CLUSTER_SLOTS), str(CLUSTER_NODES))}
    losses = per_rank(job, r"host (\S+) step=(\d+) loss=")
    assert sorted(losses) == list(range(RANKS))
    assert all([int(match.group(2)) for match in matches] == list(range(1, steps + 1)) for matches in losses.values())
    checksums = per_rank(job, r"final weights checksum (\S+)")
    assert sorted(checksums) == list(range(RANKS))
    assert len({matches[0].group(1) for matches in checksums.values()}) == 1, f"ranks disagree: {checksums}"


def test_a_horovod_rank_that_raises_fails_the_job_naming_the_rank_and_the_exception(api, horovod):
    job = submit(api, horovod.version, "horovod-train", parameters=[{"name": "fail_rank", "value": "2"}])
    job = wait_for(job, [JobStatus.FAILED], timeout=300)

    assert job.failure["kind"] == "exception", job.failure
    assert job.failure["rank"] == 2, job.failure
    assert "RuntimeError: rank 2 failed on purpose" in job.failure["exception"], job.failure


def test_the_mindspore_example_trains_on_two_nodes_and_its_ranks_agree_on_the_averaged_gradient(api, mindspore):
    steps = 5
    job = submit(api, mindspore.version, "mindspore-train", parameters=[{"name": "steps", "value": str(steps)}])
    job = wait_for(job, [JobStatus.COMPLETED], timeout=420)

    assert job.exit_code == 0
    banners = per_rank(job, rf"rank (\d+)/{RANKS} on host (\S+) mindspore")
    assert sorted(banners) == list(range(RANKS))
    assert {matches[0].group(2) for matches in banners.values()} == hosts_of(job)
    losses = per_rank(job, r"host (\S+) step=(\d+) loss=")
    assert sorted(losses) == list(range(RANKS))
    assert all(len(matches) == steps for matches in losses.values())
    for what in ("averaged gradient checksum", "final weights checksum"):
        values = per_rank(job, what + r" (\S+)")
        assert sorted(values) == list(range(RANKS)), what
        assert len({matches[0].group(1) for matches in values.values()}) == 1, f"ranks disagree on the {what}: {values}"


def test_the_horovod_example_reads_from_s3_keeps_its_checkpoints_in_obs_and_a_rebuild_resumes_from_the_last(
        api, horovod, object_store, owner):
    from jobs.management.commands.localstore import register
    from jobs.object_store.client import ObjectStore

    storage = register(object_store.endpoint, object_store.state)
    bucket = storage.user_bucket(owner.pk, owner.username)
    store = ObjectStore(storage.access())
    store.create_bucket(bucket)
    store.client.put_object(Bucket=bucket, Key="datasets/toy/samples.csv", Body=b"x,y\n1,2\n" * 100)
    urls = {"data_url": f"s3://{bucket}/datasets/toy/", "train_url": f"obs://{bucket}/runs/horovod/"}

    first = submit(api, horovod.version, "horovod-train", parameters=[{"name": "steps", "value": "3"}], **urls)
    first = wait_for(first, [JobStatus.COMPLETED], timeout=300)
    assert "data_url: 1 files, 800 bytes" in "\n".join(line.text for line in rank_lines(first))
    keys = {item.key for item in store.objects(bucket, "runs/horovod/", 10)}
    assert keys >= {"runs/horovod/checkpoints/step-3.pt", "runs/horovod/checkpoints/checkpoint.json"}, keys
    assert first.checkpoints.order_by("-saved_at").values_list("step", flat=True).first() == 3

    # Five steps in all: the rebuilt job starts from the first one's checkpoint at step 3.
    again = submit(api, horovod.version, "horovod-train", parameters=[{"name": "steps", "value": "5"}],
                   resume_from_job=first.pk, **urls)
    again = wait_for(again, [JobStatus.COMPLETED], timeout=300)
    text = "\n".join(line.text for line in rank_lines(again))
    assert "resumed from /home/ma-user/modelarts/outputs/train_url_0/checkpoints/step-3.pt after step 3" in text, text
    losses = per_rank(again, r"host (\S+) step=(\d+) loss=")
    assert sorted(losses) == list(range(RANKS))
    assert all([int(match.group(2)) for match in matches] == [4, 5] for matches in losses.values())




@pytest.mark.parametrize("engine", ["horovod", "mindspore"])
def test_an_engines_example_whose_worker_is_killed_resumes_in_attempt_2_with_the_weights_of_an_uninterrupted_run(
        api, request, engine, object_store, owner, console):
    import asyncio
    import time

    from jobs.management.commands.localstore import register
    from jobs.models import Checkpoint
    from jobs.object_store.client import ObjectStore
    from tests.integration.helpers import _node_run, log_text
    from tests.integration.test_faults import local_node, worker_of

    version = request.getfixturevalue(engine)
    storage = register(object_store.endpoint, object_store.state)
    bucket = storage.user_bucket(owner.pk, owner.username)
    store = ObjectStore(storage.access())
    store.create_bucket(bucket)
    store.client.put_object(Bucket=bucket, Key="datasets/toy/samples.csv", Body=b"x,y\n1,2\n" * 100)
    checksum = re.compile(r"rank 0 final weights checksum (\S+)")

    # Each engine reads its input from s3:// and keeps its output in obs:// (the same store).
    straight = submit(api, version.version, f"{engine}-train", parameters=[{"name": "steps", "value": "30"}],
                      data_url=f"s3://{bucket}/datasets/toy/", train_url=f"obs://{bucket}/runs/{engine}-straight/")
    straight = wait_for(straight, [JobStatus.COMPLETED], timeout=300)
    expected = checksum.search(log_text(straight))
    assert expected, log_text(straight)
    assert "data_url: 1 files, 800 bytes" in log_text(straight)
    assert any(item.key.startswith(f"runs/{engine}-straight/checkpoints/")
               for item in store.objects(bucket, f"runs/{engine}-straight/", 100))

    job = submit(api, version.version, f"{engine}-train", max_restarts=1, train_url=f"obs://{bucket}/runs/{engine}-killed/",
                 parameters=[{"name": "steps", "value": "30"}, {"name": "step_seconds", "value": "0.3"},
                             {"name": "checkpoint_every", "value": "5"}])
    wait_for(job, [JobStatus.RUNNING], timeout=300)
    deadline = time.monotonic() + 180
    while not Checkpoint.objects.filter(job=job, step__gte=10).exists():
        assert time.monotonic() < deadline, log_text(job)
        time.sleep(0.3)
    worker = worker_of(job, 1)
    asyncio.run(_node_run(local_node(console, worker.node_name), f"podman kill {worker.container_name}"))

    job = wait_for(job, [JobStatus.COMPLETED], timeout=400)
    [boundary] = job.attempt_log_starts
    second = "\n".join(line.text for line in job.log_lines.filter(seq__gt=boundary))
    resumed = re.search(r"resumed from \S+/checkpoints/step-(\d+)\.\w+ after step (\d+)", second)
    assert job.restart_count == 1 and resumed and int(resumed.group(2)) >= 10, second
    assert checksum.search(second).group(1) == expected.group(1)
