"""Which engines the form offers: only engines with a version, and a version whose console-built image is
not built yet is shown as being prepared; the admin says which nodes hold a version's image."""

import pytest

from jobs.images.recipes import MPI
from jobs.models import Engine, EngineVersion, Node, ResourceSpec

pytestmark = pytest.mark.django_db


def test_the_form_offers_engines_with_a_version_and_marks_an_unbuilt_image_as_being_prepared(client, owner, settings,
                                                                                           tmp_path):
    settings.IMAGES_DIR = tmp_path
    EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="built", image=MPI.reference)
    (tmp_path / MPI.archive_name()).write_bytes(b"archive")
    EngineVersion.objects.create(engine=Engine.objects.create(name="Horovod"), version="unbuilt",
                                 image="localhost/training-console/horovod:x-r1")
    Engine.objects.create(name="Empty")
    client.force_login(owner)
    page = client.get("/jobs/new").content.decode()
    assert ">Empty<" not in page, "an engine with no version is not offered"
    assert ">built</option>" in page, "a built image is offered as ready"
    assert "disabled>unbuilt (being prepared)</option>" in page


def test_the_admin_says_which_nodes_hold_a_versions_image(admin_client):
    spec = ResourceSpec.objects.create(name="cpu", cpu_cores=1, memory_gb=1)
    Node.objects.create(name="holds-it", address="10.0.0.1", spec=spec, health={"images": [MPI.reference]})
    Node.objects.create(name="lacks-it", address="10.0.0.2", spec=spec, health={"images": []})
    mpi = Engine.objects.create(name="MPI")
    EngineVersion.objects.create(engine=mpi, version="v", image=MPI.reference)
    page = admin_client.get(f"/admin/jobs/engine/{mpi.pk}/change/").content.decode()
    assert "holds-it" in page and "lacks-it" not in page
