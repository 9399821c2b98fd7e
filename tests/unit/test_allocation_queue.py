"""The queue: which nodes a job may get, in which order jobs get them, and what a waiting job is told."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.allocation import dispatch_pending, queue_position, release_nodes, try_allocate, waiting_reason
from jobs.models import JobStatus, Node, ResourcePool, ResourceSpec, TrainingJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def cpu():
    return ResourceSpec.objects.create(name="cpu", cpu_cores=2, memory_gb=4, cpu_slots_per_node=2)


@pytest.fixture
def gpu():
    return ResourceSpec.objects.create(name="gpu", gpu_count=8, gpu_model="NVIDIA-V100", cpu_cores=72, memory_gb=512)


@pytest.fixture
def submit(make_job):
    """Submit a job of the owner's: it waits in the queue (Pending) for nodes of its spec."""

    def submit(spec, node_count=1, pool=None, name="job") -> TrainingJob:
        return make_job(spec=spec, node_count=node_count, pool=pool, name=name)

    return submit


def make_nodes(spec, count, pool=None, prefix="n", **fields) -> list[Node]:
    return [Node.objects.create(name=f"{prefix}{index}", address=f"10.0.0.{index + 1}", spec=spec, pool=pool, **fields)
            for index in range(count)]


def holder(node: Node) -> int | None:
    node.refresh_from_db()
    return node.allocated_to_id


def test_a_job_gets_distinct_free_nodes_of_its_spec_and_moves_to_creating(cpu, gpu, submit):
    cpu_nodes = make_nodes(cpu, 2)
    make_nodes(gpu, 2, prefix="g")
    job = submit(cpu, node_count=2)

    assert try_allocate(job)

    job.refresh_from_db()
    assert job.status == JobStatus.CREATING
    assert sorted(worker.node_id for worker in job.workers.all()) == sorted(node.pk for node in cpu_nodes)
    assert [holder(node) for node in cpu_nodes] == [job.pk, job.pk]


def test_a_node_held_by_one_job_is_never_given_to_another(cpu, submit):
    node, = make_nodes(cpu, 1)
    first, second = submit(cpu, name="first"), submit(cpu, name="second")
    assert try_allocate(first)

    assert not try_allocate(second)
    assert holder(node) == first.pk
    second.refresh_from_db()
    assert second.status == JobStatus.PENDING and not second.workers.exists()


@pytest.mark.parametrize("fields, why", [
    ({"draining": True}, "draining"),
    ({"enabled": False}, "not ready"),
    ({"state": Node.State.NOT_READY, "state_message": "unreachable"}, "not ready"),
])
def test_draining_disabled_and_unhealthy_nodes_are_not_allocated_and_the_reason_says_so(cpu, submit, fields, why):
    make_nodes(cpu, 1, prefix="ok")
    make_nodes(cpu, 1, prefix="out", **fields)
    job = submit(cpu, node_count=2)

    assert not try_allocate(job)
    assert f"1 free (1 {why})" in waiting_reason(job)


def test_a_job_without_a_pool_runs_on_public_nodes_but_never_on_a_dedicated_pool(cpu, submit):
    dedicated = ResourcePool.objects.create(name="team-a", kind=ResourcePool.Kind.DEDICATED)
    public = ResourcePool.objects.create(name="shared", kind=ResourcePool.Kind.PUBLIC)
    reserved, = make_nodes(cpu, 1, pool=dedicated, prefix="d")
    open_node, = make_nodes(cpu, 1, pool=public, prefix="p")

    anyone = submit(cpu, name="anyone")
    assert try_allocate(anyone)
    assert holder(open_node) == anyone.pk

    another = submit(cpu, name="another")
    assert not try_allocate(another)
    assert holder(reserved) is None

    team_job = submit(cpu, pool=dedicated, name="team")
    assert try_allocate(team_job)
    assert holder(reserved) == team_job.pk


def test_the_queue_is_first_in_first_out_per_spec_and_pool(cpu, gpu, submit):
    make_nodes(cpu, 2)
    make_nodes(gpu, 1, prefix="g")
    blocker = submit(cpu, node_count=1, name="blocker")
    assert try_allocate(blocker)
    big = submit(cpu, node_count=2, name="big")
    small = submit(cpu, node_count=1, name="small")
    other_spec = submit(gpu, node_count=1, name="other-spec")

    started = dispatch_pending()

    # One cpu node is free, but the big job came first: the small one waits behind it.
    assert started == [other_spec.pk]
    assert queue_position(TrainingJob.objects.get(pk=big.pk)) == 1
    assert queue_position(TrainingJob.objects.get(pk=small.pk)) == 2
    assert queue_position(TrainingJob.objects.get(pk=other_spec.pk)) is None


def test_jobs_submitted_in_the_same_instant_are_served_by_id(cpu, submit):
    make_nodes(cpu, 1)
    first, second = submit(cpu, name="first"), submit(cpu, name="second")
    TrainingJob.objects.filter(pk=second.pk).update(created_at=first.created_at)
    second.refresh_from_db()

    assert (queue_position(first), queue_position(second)) == (1, 2)
    assert dispatch_pending() == [first.pk]


def test_a_waiting_job_is_told_what_it_needs_what_is_free_and_where_it_stands(cpu, submit):
    make_nodes(cpu, 2)
    running = submit(cpu, node_count=1, name="running")
    assert try_allocate(running)
    ahead = submit(cpu, node_count=2, name="ahead")
    behind = submit(cpu, node_count=2, name="behind")

    assert waiting_reason(ahead) == f"needs 2 × {cpu.display}, 1 free (1 busy); position 1 in the queue"
    assert waiting_reason(behind) == (
        f"needs 2 × {cpu.display}, 1 free (1 busy); position 2 in the queue, 1 job(s) ahead")
    assert waiting_reason(running) == ""


def test_a_job_larger_than_its_pool_is_told_the_pool_is_too_small(cpu, submit):
    make_nodes(cpu, 2)
    job = submit(cpu, node_count=3)

    assert "the pool has only 2 node(s) of this spec" in waiting_reason(job)


def test_released_nodes_go_to_the_next_job_in_the_queue(cpu, submit):
    nodes = make_nodes(cpu, 2)
    first = submit(cpu, node_count=2, name="first")
    second = submit(cpu, node_count=2, name="second")
    assert dispatch_pending() == [first.pk]

    assert release_nodes(first.pk) == 2
    assert dispatch_pending() == [second.pk]
    assert {holder(node) for node in nodes} == {second.pk}


def running_for(job: TrainingJob, hours_ago: float) -> None:
    """The job holds its nodes and has been running this long."""
    assert try_allocate(job)
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING,
                                                 started_at=timezone.now() - timedelta(hours=hours_ago))


def test_a_short_job_backfills_free_nodes_when_it_ends_before_the_head_can_start(cpu, submit):
    make_nodes(cpu, 3)
    long_one = submit(cpu, node_count=2, name="long-one")
    TrainingJob.objects.filter(pk=long_one.pk).update(auto_stop_hours=6)
    running_for(TrainingJob.objects.get(pk=long_one.pk), hours_ago=1)  # sure to be over in 5 h
    head = submit(cpu, node_count=3, name="head")
    short = submit(cpu, node_count=1, name="short")
    TrainingJob.objects.filter(pk=short.pk).update(auto_stop_hours=2)
    unlimited = submit(cpu, node_count=1, name="unlimited")
    too_long = submit(cpu, node_count=1, name="too-long")
    TrainingJob.objects.filter(pk=too_long.pk).update(auto_stop_hours=6)

    started = dispatch_pending()

    assert started == [short.pk], "only the job sure to end before the head can start jumps ahead"
    assert TrainingJob.objects.get(pk=head.pk).status == JobStatus.PENDING
    assert {TrainingJob.objects.get(pk=job.pk).status for job in (unlimited, too_long)} == {JobStatus.PENDING}


def test_no_job_jumps_a_head_whose_start_has_no_bound(cpu, submit):
    make_nodes(cpu, 2)
    running_for(submit(cpu, node_count=1, name="no-limit"), hours_ago=1)
    submit(cpu, node_count=2, name="head")
    short = submit(cpu, node_count=1, name="short")
    TrainingJob.objects.filter(pk=short.pk).update(auto_stop_hours=1)

    assert dispatch_pending() == []


def test_a_job_that_could_never_get_its_nodes_is_refused_at_submission(cpu, owner):
    from tests.fixtures import api_client

    make_nodes(cpu, 2)
    make_nodes(cpu, 1, prefix="off", enabled=False)
    answer = api_client(owner).post("/api/v1/training-jobs", {
        "name": "too-big", "engine": "MPI", "code_dir": "code", "boot_file": "train.py", "spec": "cpu",
        "node_count": 3}, format="json")
    assert answer.status_code == 400
    assert answer.json()["node_count"] == ["The pool has 2 node(s) of this spec; ask for at most that many."]


def test_no_more_jobs_start_than_the_consoles_workers_have_run_slots_and_the_next_is_told_why(cpu, submit, settings):
    settings.RUN_SLOTS = 2
    make_nodes(cpu, 4)
    jobs = [submit(cpu, name=f"job-{index}") for index in range(3)]

    assert dispatch_pending() == [jobs[0].pk, jobs[1].pk]
    waiting = TrainingJob.objects.get(pk=jobs[2].pk)
    assert waiting.status == JobStatus.PENDING
    assert waiting_reason(waiting).endswith(
        "2 free (2 busy); position 1 in the queue; and every run slot is taken: 2 job(s) being prepared, running "
        "or stopped, the most the console runs at once (RUN_SLOTS)")
    too_big = submit(cpu, node_count=9, name="too-big")
    assert "the pool has only 4 node(s) of this spec" in waiting_reason(too_big)  # what a free slot would not mend
    assert Node.objects.filter(allocated_to__isnull=True).count() == 2

    TrainingJob.objects.filter(pk=jobs[0].pk).update(status=JobStatus.COMPLETED)
    release_nodes(jobs[0].pk)
    assert dispatch_pending() == [jobs[2].pk]
