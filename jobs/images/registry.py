"""The console's image registry: the shipped images as a Docker registry (Debian's `docker-registry`, the CNCF
distribution server) on the console's host, from which a node pulls only the layers it lacks.

The three engine images are built on one base image (jobs.images.recipes.BASE), so a node that holds one of
them takes only the others' own layers: the Python packages. `podman load` of an archive always reads and
stores every layer (bench/image_transfer.py measures both ways).

How it is kept safe and offline:
- The server the nodes reach is read-only and listens on the console's loopback only. A node reaches it for
  the length of one pull, through a port its SSH server forwards back to the console over the connection the
  console already holds (jobs.runtime.node_images): no firewall opening, nothing the nodes must trust but SSH.
- Images are pulled by their manifest's digest, which the console wrote down when it pushed them, so a node
  takes those bytes or nothing, whatever else answers on that port.
- Only `manage.py buildimages` pushes, to a writable server of its own that it starts on a free loopback port
  for the push and stops after it.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from jobs.images.recipes import REGISTRY_PREFIX, archive_name_of

Progress = Callable[[str], None]


class RegistryError(RuntimeError):
    pass


def storage_dir() -> Path:
    return Path(settings.IMAGES_DIR) / "registry"


def binary() -> str | None:
    return shutil.which("docker-registry")


def repository_of(reference: str) -> str:
    """The registry's name for an image reference: localhost/training-console/mpi:TAG -> training-console/mpi."""
    if not reference.startswith(REGISTRY_PREFIX + "/"):
        raise ValueError(f"{reference} is not one of the console's own images ({REGISTRY_PREFIX}/...)")
    return reference.removeprefix("localhost/").rpartition(":")[0]


def digest_path(reference: str) -> Path:
    return Path(settings.IMAGES_DIR) / (archive_name_of(reference).removesuffix(".tar") + ".digest")


def pushed_digest(reference: str) -> str | None:
    """The manifest digest the image was pushed as (`sha256:...`), or None where it was not pushed."""
    try:
        text = digest_path(reference).read_text().strip()
    except OSError:
        return None
    return text if text.startswith("sha256:") and len(text) == 71 else None


def config(storage: Path, port: int, *, read_only: bool) -> str:
    """The server's configuration (YAML is a superset of JSON): the file system under `storage`, on loopback."""
    maintenance: dict[str, object] = {"uploadpurging": {"enabled": False}}
    if read_only:
        maintenance["readonly"] = {"enabled": True}
    return json.dumps({
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        # No blob descriptor cache: the read-only server shares the folder with the push's server, and must see
        # what that one wrote.
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "maintenance": maintenance},
        "http": {"addr": f"127.0.0.1:{port}"},
    }, indent=1)


def start(config_file: Path, port: int, text: str, log_path: Path,
          preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen[bytes]:
    """A registry server with this configuration, once it answers on `port`."""
    found = binary()
    if found is None:
        raise RegistryError("docker-registry is not installed (Debian package docker-registry; make run installs it)")
    storage_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(text)
    with open(log_path, "ab") as log:
        process = subprocess.Popen([found, "serve", str(config_file)], stdout=log, stderr=subprocess.STDOUT,
                                   preexec_fn=preexec_fn)
    deadline = time.monotonic() + 30
    while not answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise RegistryError(f"the image registry did not answer on 127.0.0.1:{port} (see {log_path})")
        time.sleep(0.1)
    return process


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def publish(reference: str, push: Callable[[str, str, Path], None], say: Progress) -> str | None:
    """Push the image to the registry's folder once (its digest kept beside its archive); None where this host
    has no docker-registry (nodes then get the archive)."""
    known = pushed_digest(reference)
    if known:
        return known
    if binary() is None:
        say(f"{reference}: not in a registry (docker-registry is not installed): nodes get its archive")
        return None
    port = free_port()
    folder = Path(settings.IMAGES_DIR)
    server = start(folder / "registry-push.yml", port, config(storage_dir(), port, read_only=False),
                   folder / "registry-push.log")
    digest_file = digest_path(reference)
    partial = digest_file.with_suffix(".digest.partial")
    started = time.monotonic()
    try:
        push(reference, f"127.0.0.1:{port}/{repository_of(reference)}:{reference.rpartition(':')[2]}", partial)
    finally:
        stop(server)
    os.replace(partial, digest_file)
    digest = pushed_digest(reference)
    if digest is None:
        raise RegistryError(f"the push of {reference} wrote no digest to {digest_file}")
    say(f"{reference}: in the console's registry as {digest[:19]}... ({time.monotonic() - started:.0f} s)")
    return digest
