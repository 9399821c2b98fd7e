"""A node that lacks an engine image pulls from the console's registry, through its own SSH connection, only the
layers it lacks (the engine images share their base); with no registry it gets the whole archive over SFTP.
Real nodes (the local cluster's), the real registry (Debian's docker-registry), real Podman."""

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from jobs.images import registry
from jobs.images.recipes import HOROVOD, MPI
from jobs.runtime.node_images import ensure_image
from jobs.runtime.ssh import connect
from tests.integration.helpers import on_node

MANIFEST_TYPES = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"


def bring(node, reference: str) -> list[str]:
    """What the console said while it brought the image to the node, as a job's preparation does."""
    said: list[str] = []

    async def say(text: str) -> None:
        said.append(text)

    async def over_ssh() -> None:
        async with await connect(node.ssh_target()) as connection:
            await ensure_image(connection, node.name, reference, say)

    asyncio.run(over_ssh())
    return said


def layers(reference: str) -> dict[str, int]:
    """The image's layers in the registry (compressed digest -> bytes), from its manifest."""
    url = (f"http://127.0.0.1:{settings.IMAGE_REGISTRY_PORT}/v2/{registry.repository_of(reference)}/manifests/"
           f"{registry.pushed_digest(reference)}")
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": MANIFEST_TYPES}), timeout=10) as answer:
        return {layer["digest"]: layer["size"] for layer in json.load(answer)["layers"]}


def received_mib(said: list[str]) -> int:
    found = re.search(r"pulled, ([\d,]+) MiB received", said[-1])
    assert found, said
    return int(found.group(1).replace(",", ""))


def test_a_node_holding_one_engine_image_takes_only_the_layers_another_adds_to_their_shared_base(
        console, horovod_image):
    node, local = console["nodes"][0], console["cluster"][0]
    # No image at all on the node, whatever earlier tests left and by whichever name: a base that came by
    # `podman load` is not known by its registry digest, and one still stored would be taken as it is.
    on_node(local, "podman rmi --all --force >/dev/null 2>&1 || true")
    bring(node, MPI.reference)
    assert on_node(local, f"podman image exists {HOROVOD.reference} && echo yes || echo no").strip() == "no"

    said = bring(node, HOROVOD.reference)

    assert "pulling the layers it lacks from the console's registry" in said[0], said
    horovod, mpi = layers(HOROVOD.reference), layers(MPI.reference)
    shared = set(horovod) & set(mpi)
    assert shared, "the engine images share their base's layers"
    own_mib = sum(size for digest, size in horovod.items() if digest not in shared) / 2**20
    all_mib = sum(horovod.values()) / 2**20
    # Its own layers and the manifest and config, nothing of the base the node already held.
    assert own_mib - 1 <= received_mib(said) <= own_mib + 2, (said[-1], own_mib, all_mib)
    assert received_mib(said) < all_mib - sum(mpi.values()) / 2**20 / 2
    version = on_node(local, f"podman run --rm --pull=never {HOROVOD.reference} "
                             "python -c 'import horovod.torch, horovod; print(horovod.__version__)'")
    assert version.strip() == "0.28.1"
    # It keeps its usual name alone (not the one it was pulled by), so removing that name removes the image.
    assert "Deleted: " in on_node(local, f"podman rmi {HOROVOD.reference}")


def test_with_no_registry_a_node_gets_the_whole_archive_over_sftp(console, settings):
    node, local = console["nodes"][1], console["cluster"][1]
    on_node(local, f"podman rmi --force {MPI.reference} >/dev/null 2>&1 || true")
    settings.IMAGE_REGISTRY_PORT = 0

    said = bring(node, MPI.reference)

    assert "copying it from the console" in said[0] and any("loading" in text for text in said), said
    assert on_node(local, f"podman image exists {MPI.reference} && echo yes || echo no").strip() == "yes"
    assert on_node(local, "ls -A /var/lib/training-console/image-cache").strip() == "", "the archive's copy is removed"


def test_two_transfers_of_one_image_to_one_node_at_once_bring_it_once_and_the_second_waits_for_the_first(console):
    node, local = console["nodes"][1], console["cluster"][1]
    on_node(local, "podman rmi --all --force >/dev/null 2>&1 || true")
    said: list[list[str]] = [[], []]

    async def both() -> None:
        async def one(index: int) -> None:
            async def say(text: str) -> None:
                said[index].append(text)

            async with await connect(node.ssh_target()) as connection:
                await ensure_image(connection, node.name, MPI.reference, say)

        await asyncio.gather(one(0), one(1))

    asyncio.run(both())
    brought = [texts for texts in said if any(" pulled, " in text or ": loading " in text for text in texts)]
    waited = [texts for texts in said if any("is being brought to it by another job: waiting" in text for text in texts)]
    assert len(brought) == 1 and len(waited) == 1 and brought != waited, said
    assert on_node(local, f"podman image exists {MPI.reference} && echo yes || echo no").strip() == "yes"


@pytest.fixture
def images_dir(settings):
    """A folder of images of the test's own, with a short path (podman refuses a runroot of over 50 characters)."""
    folder = Path(tempfile.mkdtemp(prefix="tc-images-"))
    settings.IMAGES_DIR = folder
    yield folder
    subprocess.run(["podman", "--root", str(folder / "store"), "--runroot", str(folder / "run"), "system", "reset",
                    "--force"], capture_output=True, check=False)
    shutil.rmtree(folder, ignore_errors=True)


def test_a_collection_drops_the_images_no_recipe_names_and_their_own_layers_and_keeps_the_current_ones(
        images_dir, monkeypatch):
    from jobs.images import build

    # A registry folder of its own, and two small images of one repository, as two builds of one recipe leave.
    tmp_path = images_dir
    said: list[str] = []
    references = {}
    for tag in ("old", "new"):
        context = tmp_path / f"context-{tag}"
        context.mkdir()
        (context / "Containerfile").write_text("FROM scratch\nCOPY data.bin /data.bin\n")
        (context / "data.bin").write_bytes(tag.encode() * 400_000)
        references[tag] = f"localhost/training-console/tiny:{tag}"
        build.podman("build", "-t", references[tag], "-f", str(context / "Containerfile"), str(context))
        assert registry.publish(references[tag], build._push, said.append), said
    blobs = tmp_path / "registry" / "docker" / "registry" / "v2" / "blobs" / "sha256"

    def stored() -> set[str]:
        return {f"sha256:{path.name}" for path in blobs.glob("*/*")}

    def own_blobs(reference: str) -> set[str]:
        manifest = json.loads((blobs / registry.pushed_digest(reference)[7:9] / registry.pushed_digest(reference)[7:]
                               / "data").read_bytes())
        return {registry.pushed_digest(reference), manifest["config"]["digest"],
                *(layer["digest"] for layer in manifest["layers"])}

    old, new = own_blobs(references["old"]), own_blobs(references["new"])
    assert old | new <= stored() and not old & new

    # A collection whose garbage-collect fails has dropped the tag, and the next one collects all the same.
    monkeypatch.setattr(registry, "binary", lambda: "/bin/false")
    assert registry.collect_garbage([references["new"]], said.append) == [references["old"]]
    assert old | new <= stored() and "kept its old layers: garbage-collect failed" in said[-1], said
    monkeypatch.undo()

    assert registry.collect_garbage([references["new"]], said.append) == [], "no tag is left to drop"

    assert not old & stored() and new <= stored(), "the old image's blobs are gone, the current one's all there"
    assert re.search(r"dropped 0 image\(s\) no recipe names \(earlier\): [\d,]+ MiB freed", said[-1]), said
    said.clear()
    assert registry.collect_garbage([references["new"]], said.append) == [] and said == [], "nothing pending: no run"
    # A digest kept for an image the registry no longer holds (a checkout of other recipes collected it) is
    # pushed again rather than trusted.
    (registry.storage_dir() / "docker/registry/v2/repositories/training-console/tiny/_manifests/tags/new").rename(
        tmp_path / "gone")
    assert registry.publish(references["new"], build._push, said.append) == registry.pushed_digest(references["new"])
    assert (registry.storage_dir() / "docker/registry/v2/repositories/training-console/tiny/_manifests/tags/new").is_dir()
