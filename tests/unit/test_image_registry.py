"""The engine images share one base, and nodes pull from the console's registry only the layers they lack: the
recipes, the registry's configuration and the digests it is pulled by, the relay that counts what a pull
receives, and a node's way to an image (the SSH side faked)."""

import asyncio
import dataclasses
import json
import shutil
from types import SimpleNamespace

import asyncssh
import pytest

from jobs.images import registry
from jobs.images.recipes import BASE, HOROVOD, MINDSPORE, MPI, PY_SPY, SHIPPED
from jobs.runtime import node_images
from jobs.runtime.image_relay import CountingRelay
from tests.unit.fake_lock_holder import lock_holder

DIGEST = "sha256:" + "ab" * 32
IMAGE_ID = "cd" * 32


def test_every_engine_image_is_built_on_the_one_base_that_holds_mpi_ssh_and_py_spy():
    assert {recipe.parent for recipe in SHIPPED.values()} == {BASE}
    assert {recipe.base_reference for recipe in SHIPPED.values()} == {BASE.reference}
    assert PY_SPY in BASE.wheels and {"openmpi-bin", "openssh-server", "libgomp1"} <= set(BASE.packages)
    assert BASE.base_reference == f"localhost/training-console/base-rootfs:{BASE.tag}", "the base has a root filesystem"


def test_a_change_to_the_base_gives_every_engine_image_a_new_tag():
    changed = dataclasses.replace(BASE, packages=(*BASE.packages, "less"))
    for recipe in (MPI, HOROVOD, MINDSPORE):
        assert dataclasses.replace(recipe, parent=changed).tag != recipe.tag


def test_the_registry_names_an_image_without_its_host_and_tag_and_knows_only_the_consoles_own():
    assert registry.repository_of(MPI.reference) == "training-console/mpi"
    with pytest.raises(ValueError, match="not one of the console's own images"):
        registry.repository_of("docker.io/library/python:3.11")


def test_the_registry_the_nodes_reach_listens_on_loopback_and_takes_no_push():
    served = json.loads(registry.config(registry.storage_dir(), 5077, read_only=True))
    assert served["http"]["addr"] == "127.0.0.1:5077"
    assert served["storage"]["maintenance"]["readonly"] == {"enabled": True}
    assert "cache" not in served["storage"], "it must see what the push's own server wrote"
    pushing = json.loads(registry.config(registry.storage_dir(), 40000, read_only=False))
    assert "readonly" not in pushing["storage"]["maintenance"]


def test_a_digest_file_that_is_not_a_sha256_digest_is_not_believed(settings, tmp_path):
    settings.IMAGES_DIR = str(tmp_path)
    path = registry.digest_path(MPI.reference)
    assert path.name == MPI.archive_name().removesuffix(".tar") + ".digest"
    assert registry.pushed_digest(MPI.reference) is None
    path.write_text("sha256:short\n")
    assert registry.pushed_digest(MPI.reference) is None
    path.write_text(DIGEST + "\n")
    assert registry.pushed_digest(MPI.reference) == DIGEST


def tag_in_registry(reference: str) -> None:
    """The registry's folder holds DIGEST under the reference's tag, as a push leaves it."""
    tag = (registry.storage_dir() / "docker/registry/v2/repositories" / registry.repository_of(reference) / "_manifests"
           / "tags" / reference.rpartition(":")[2] / "current" / "link")
    tag.parent.mkdir(parents=True, exist_ok=True)
    tag.write_text(DIGEST)


def test_an_image_is_pushed_once_and_never_where_no_registry_is_installed(settings, tmp_path, monkeypatch):
    settings.IMAGES_DIR = str(tmp_path)
    said: list[str] = []
    pushes: list[str] = []

    def push(source, destination, digest_file):
        pushes.append(destination)
        digest_file.write_text(DIGEST)

    monkeypatch.setattr(registry, "binary", lambda: None)
    assert registry.publish(MPI.reference, push, said.append) is None
    assert pushes == [] and "nodes get its archive" in said[-1]

    monkeypatch.setattr(registry, "binary", lambda: "/usr/bin/docker-registry")
    registry.digest_path(MPI.reference).write_text(DIGEST)
    tag_in_registry(MPI.reference)
    assert registry.publish(MPI.reference, push, said.append) == DIGEST
    assert pushes == [], "a digest on record that the registry holds under the tag means the registry has the image"
    registry.forget(MPI.reference)
    assert registry.pushed_digest(MPI.reference) is None, "a rebuilt image forgets the digest of the one before"


def test_a_digest_is_never_taken_for_an_image_of_another_registry_with_the_same_name_and_tag(settings, tmp_path):
    settings.IMAGES_DIR = str(tmp_path)
    registry.digest_path(MPI.reference).write_text(DIGEST)
    assert registry.pushed_digest("quay.io/someone/" + MPI.reference.rsplit("/", 1)[1]) is None


def test_a_pull_asks_only_for_the_registrys_ping_and_the_consoles_images_by_digest():
    allowed = registry.PULL_REQUEST
    assert allowed.match(b"GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert allowed.match(f"HEAD /v2/training-console/mpi/manifests/{DIGEST} HTTP/1.1\r\n".encode())
    assert allowed.match(f"GET /v2/training-console/horovod/blobs/{DIGEST} HTTP/1.1\r\n".encode())
    for refused in (b"POST /v2/training-console/mpi/blobs/uploads/ HTTP/1.1\r\n",
                    b"GET /v2/training-console/mpi/manifests/latest HTTP/1.1\r\n",
                    b"GET /v2/_catalog HTTP/1.1\r\n",
                    f"GET /v2/other/mpi/blobs/{DIGEST} HTTP/1.1\r\n".encode(),
                    b"\x16\x03\x01\x02\x00\x01"):  # a TLS hello
        assert not allowed.match(refused), refused


async def _upstream(size: int, heard: list[bytes]) -> asyncio.Server:
    async def answer(reader, writer):
        heard.append(await reader.read(1000))
        writer.write(b"x" * size)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


def test_the_relay_passes_a_pulls_requests_and_every_byte_back_and_counts_what_the_registry_sent():
    async def through_relay() -> tuple[int, int, list[bytes]]:
        heard: list[bytes] = []
        upstream = await _upstream(3 * 2**20 + 7, heard)
        relay = await CountingRelay.start("127.0.0.1", upstream.sockets[0].getsockname()[1], registry.PULL_REQUEST)
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(b"GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        received = len(await reader.read())
        writer.close()
        await relay.close()
        upstream.close()
        return received, relay.sent, heard

    received, counted, heard = asyncio.run(through_relay())
    assert received == counted == 3 * 2**20 + 7
    assert heard == [b"GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"]


def test_the_relay_closes_a_connection_that_asks_to_push_and_passes_none_of_it():
    async def push_through_relay() -> tuple[bytes, int, list[bytes]]:
        heard: list[bytes] = []
        upstream = await _upstream(10, heard)
        relay = await CountingRelay.start("127.0.0.1", upstream.sockets[0].getsockname()[1], registry.PULL_REQUEST)
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(b"POST /v2/training-console/mpi/blobs/uploads/ HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        await relay.close()
        upstream.close()
        return answer, relay.refused, heard

    answer, refused, heard = asyncio.run(push_through_relay())
    assert refused == 1 and b"POST" not in b"".join(heard)
    assert answer == b"" or answer == b"x" * 10  # (the upstream may have answered the connection itself, empty)


class PullingNode:
    """A node's SSH side: what it was told to run, and whether its SSH server forwards a port back."""

    def __init__(self, forwards: bool, pull_fails: bool = False, lock_waits_out: bool = False):
        self.forwards, self.pull_fails, self.commands, self.listeners = forwards, pull_fails, [], []
        # flock's answer: "locked", or nothing once its wait ran out (another transfer held the lock throughout).
        self.lock_answer = "" if lock_waits_out else "locked\n"

    async def run(self, command, check=False, timeout=None, **_):
        self.commands.append(command)
        if command.startswith("podman image exists"):
            return SimpleNamespace(exit_status=1, stdout="", stderr="")
        if command.startswith("podman pull") and self.pull_fails:
            return SimpleNamespace(exit_status=125, stdout="", stderr="Error: proxyconnect tcp: dial tcp: refused")
        return SimpleNamespace(exit_status=0, stdout=IMAGE_ID + "\n" if command.startswith("podman pull") else "",
                               stderr="")

    async def forward_remote_port(self, listen_host, listen_port, dest_host, dest_port):
        if not self.forwards:
            raise asyncssh.ChannelListenError("remote port forwarding refused")
        async def wait_closed():
            self.listeners.append("closed")

        listener = SimpleNamespace(get_port=lambda: 41999, close=lambda: None, wait_closed=wait_closed,
                                   to=(listen_host, listen_port, dest_host, dest_port))
        self.listeners.append(listener)
        return listener

    async def create_process(self, command):
        self.commands.append(command)
        return lock_holder(self.commands, self.lock_answer)

    def start_sftp_client(self):
        node = self

        class Sftp:
            async def __aenter__(self):
                return self

            async def __aexit__(self, *exc_info):
                return None

            async def put(self, local, remote, progress_handler=None):
                node.commands.append(f"sftp put {remote}")

        return Sftp()


@pytest.fixture
def registry_answering(settings, tmp_path):
    """A digest on record for the MPI image, an archive of it, and something answering on the registry's port."""
    settings.IMAGES_DIR = str(tmp_path)
    registry.digest_path(MPI.reference).write_text(DIGEST)
    tag_in_registry(MPI.reference)
    (tmp_path / MPI.archive_name()).write_bytes(b"an image archive")

    async def with_registry(test):
        server = await asyncio.start_server(lambda reader, writer: writer.close(), "127.0.0.1", 0)
        settings.IMAGE_REGISTRY_PORT = server.sockets[0].getsockname()[1]
        try:
            return await test()
        finally:
            server.close()

    return with_registry


def test_a_node_pulls_the_image_by_its_digest_through_a_port_forwarded_for_the_pull_alone(registry_answering):
    node, said = PullingNode(forwards=True), []

    async def say(text):
        said.append(text)

    asyncio.run(registry_answering(lambda: node_images.ensure_image(node, "node-1", MPI.reference, say)))
    pull = f"podman pull --quiet --tls-verify=false 127.0.0.1:41999/training-console/mpi@{DIGEST}"
    exists, cache, lock, exists_again, *rest = node.commands
    assert exists == exists_again == f"podman image exists {MPI.reference}", "looked at again once the lock is held"
    assert cache == f"mkdir -p {node_images.NODE_IMAGE_CACHE} {node_images.NODE_IMAGE_CACHE}.locks"
    assert lock.startswith(f"flock -w 900 {node_images.NODE_IMAGE_CACHE}.locks/")
    assert rest == [pull, f"podman tag {IMAGE_ID} {MPI.reference}", f"podman untag {IMAGE_ID} {pull.rsplit(' ', 1)[1]}",
                    "lock released"]
    assert node.listeners[0].to[:2] == ("127.0.0.1", 0), "the node listens on its loopback, on a port of its choice"
    assert node.listeners[-1] == "closed", "the forwarded port is closed after the pull"
    assert "pulling the layers it lacks from the console's registry" in said[0] and "pulled" in said[-1]


def test_a_transfer_that_waited_out_anothers_hold_on_the_image_brings_it_all_the_same_saying_so(registry_answering):
    node, said = PullingNode(forwards=True, lock_waits_out=True), []

    async def say(text):
        said.append(text)

    asyncio.run(registry_answering(lambda: node_images.ensure_image(node, "node-1", MPI.reference, say)))
    assert any(command.startswith("podman pull") for command in node.commands) and node.commands[-1] == "lock released"
    assert any("did not end within 900 s: bringing it all the same" in text for text in said), said


def test_a_digest_whose_tag_the_registry_no_longer_holds_sends_the_node_to_the_archive(registry_answering):
    node, said = PullingNode(forwards=True), []

    async def say(text):
        said.append(text)

    shutil.rmtree(registry.storage_dir())
    asyncio.run(registry_answering(lambda: node_images.ensure_image(node, "node-1", MPI.reference, say)))
    assert not any(command.startswith("podman pull") for command in node.commands) and node.listeners == []
    assert any(command.startswith("podman load") for command in node.commands)


def test_a_node_whose_ssh_server_forwards_no_port_gets_the_whole_archive(registry_answering):
    node, said = PullingNode(forwards=False), []

    async def say(text):
        said.append(text)

    asyncio.run(registry_answering(lambda: node_images.ensure_image(node, "node-1", MPI.reference, say)))
    assert not any(command.startswith("podman pull") for command in node.commands)
    assert any(command.startswith("sftp put") for command in node.commands)
    assert any(command.startswith("podman load") for command in node.commands)
    assert "forwards no port to the console's registry" in said[0]


def test_without_a_registry_answering_the_node_gets_the_archive(settings, tmp_path):
    settings.IMAGES_DIR = str(tmp_path)
    registry.digest_path(MPI.reference).write_text(DIGEST)
    (tmp_path / MPI.archive_name()).write_bytes(b"an image archive")
    settings.IMAGE_REGISTRY_PORT = 0
    node = PullingNode(forwards=True)

    async def say(_text):
        return None

    asyncio.run(node_images.ensure_image(node, "node-1", MPI.reference, say))
    assert node.listeners == [] and any(command.startswith("podman load") for command in node.commands)


def test_a_pull_that_fails_on_the_node_falls_back_to_the_archive(registry_answering):
    node, said = PullingNode(forwards=True, pull_fails=True), []

    async def say(text):
        said.append(text)

    asyncio.run(registry_answering(lambda: node_images.ensure_image(node, "node-1", MPI.reference, say)))
    assert any(command.startswith("podman pull") for command in node.commands)
    assert any(command.startswith("podman load") for command in node.commands)
    assert any("could not pull" in text and "copying the archive" in text for text in said), said
    assert node.listeners[-1] == "closed"
