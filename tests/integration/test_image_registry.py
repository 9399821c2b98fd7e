"""A node that lacks an engine image pulls from the console's registry, through its own SSH connection, only the
layers it lacks (the engine images share their base); with no registry it gets the whole archive over SFTP.
Real nodes (the local cluster's), the real registry (Debian's docker-registry), real Podman."""

import asyncio
import json
import re
import urllib.request

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
