"""Engine images go to the nodes before a job needs them: which images and nodes a prefetch takes, and what
asks for one (a version added or whose image changed, a node added or enabled, the console's start)."""

from types import SimpleNamespace

import pytest

from jobs import tasks
from jobs.models import Engine, EngineVersion, Node, ResourcePool, ResourceSpec
from jobs.runtime.image_prefetch import prefetch_nodes, wanted_images

pytestmark = pytest.mark.django_db

IMAGE = "registry.example.org/mpi:1"
VERSIONS_FORMSET = {"versions-TOTAL_FORMS": "1", "versions-INITIAL_FORMS": "0", "versions-MIN_NUM_FORMS": "0",
                    "versions-MAX_NUM_FORMS": "1000", "versions-0-version": "v1", "versions-0-python": "python",
                    "versions-0-default_env": "{}", "_save": "Save"}


@pytest.fixture
def queued(monkeypatch):
    """What the pages and the admin asked the workers for, by task name (the broker is not reached)."""
    asked: list[tuple] = []
    monkeypatch.setattr("jobs.submission.task_queue._queue", lambda task, *args: asked.append((task, *args)) or True)
    return asked


@pytest.fixture
def spec():
    return ResourceSpec.objects.create(name="cpu", cpu_cores=1, memory_gb=1)


def test_a_prefetch_takes_every_versions_image_once_and_the_enabled_nodes_of_the_consoles_own_pools(spec):
    mpi = Engine.objects.create(name="MPI")
    first = EngineVersion.objects.create(engine=mpi, version="a", image=IMAGE)
    EngineVersion.objects.create(engine=mpi, version="b", image=IMAGE)
    EngineVersion.objects.create(engine=mpi, version="no-image", image="")
    slurm = ResourcePool.objects.create(name="cluster", backend=ResourcePool.Backend.SLURM)
    ready = Node.objects.create(name="ready", address="10.0.0.1", spec=spec)
    Node.objects.create(name="disabled", address="10.0.0.2", spec=spec, enabled=False)
    Node.objects.create(name="slurms", address="10.0.0.3", spec=spec, pool=slurm)

    assert wanted_images() == [IMAGE] and wanted_images([first.pk]) == [IMAGE] and wanted_images([0]) == []
    assert [node.name for node in prefetch_nodes()] == ["ready"]
    assert prefetch_nodes([ready.pk + 100]) == []


def test_a_version_the_operator_adds_or_gives_another_image_is_sent_to_the_nodes(
        admin_client, queued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        added = admin_client.post("/admin/jobs/engine/add/", {**VERSIONS_FORMSET, "name": "MPI",
                                                                "versions-0-image": IMAGE})
    assert added.status_code == 302
    version = EngineVersion.objects.get()
    assert queued == [("jobs.tasks.prefetch_images", None, [version.pk])]

    queued.clear()
    engine = version.engine
    unchanged = {**VERSIONS_FORMSET, "name": "MPI", "versions-INITIAL_FORMS": "1", "versions-0-id": version.pk,
                 "versions-0-engine": engine.pk, "versions-0-image": IMAGE}
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(f"/admin/jobs/engine/{engine.pk}/change/", unchanged)
    assert queued == []  # nothing new to bring
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(f"/admin/jobs/engine/{engine.pk}/change/", {**unchanged, "versions-0-image": IMAGE + "b"})
    assert queued == [("jobs.tasks.prefetch_images", None, [version.pk])]


def test_a_node_the_operator_enables_is_given_the_images(admin_client, queued, spec, django_capture_on_commit_callbacks):
    node = Node.objects.create(name="back", address="10.0.0.9", spec=spec, enabled=False)
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post("/admin/jobs/node/", {"action": "enable", "_selected_action": [node.pk]})
    assert ("jobs.tasks.prefetch_images", [node.pk], None) in queued


def test_the_prefetch_at_start_is_asked_by_the_runs_worker_only_and_not_where_it_is_off(monkeypatch, settings):
    asked = []
    monkeypatch.setattr(tasks.prefetch_images, "delay", lambda *args: asked.append(args))
    consumer = SimpleNamespace(task_consumer=SimpleNamespace(queues=[SimpleNamespace(name="control")]))
    tasks.prefetch_images_at_start(sender=consumer)
    assert asked == []
    consumer.task_consumer.queues.append(SimpleNamespace(name="runs"))
    tasks.prefetch_images_at_start(sender=consumer)
    assert asked == [()]
    settings.IMAGE_PREFETCH = False
    tasks.prefetch_images_at_start(sender=consumer)
    monkeypatch.setattr("jobs.runtime.image_prefetch.prefetch", lambda *args: asked.append(("ran", *args)))
    tasks.prefetch_images([1], None)
    assert asked == [()]
