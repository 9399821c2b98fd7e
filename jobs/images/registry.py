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
  for the push and stops after it. It then drops the tags no current recipe names and the layers only they
  reached (collect_garbage): each change of an engine's recipe would otherwise leave its old layers behind.
"""

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from console.services import free_port, stop, wait_for_port
from jobs.images.recipes import REGISTRY_PREFIX, archive_name_of

Progress = Callable[[str], None]
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# What a node's pull of the console's images asks the registry, and nothing else (jobs.runtime.image_relay): its
# ping, then manifests and blobs, each by digest, of the console's own repositories.
PULL_REQUEST = re.compile(
    rb"(?:GET|HEAD) /v2/(?:" + re.escape(REGISTRY_PREFIX.split("/", 1)[1].encode())
    + rb"/[a-z0-9._-]+/(?:manifests|blobs)/sha256:[0-9a-f]{64})? HTTP/1\.1\r\n")


# The most a collection of the registry's folder may take (it reads every manifest, then removes files).
COLLECT_SECONDS = 600


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
    """The manifest digest the console's own image was pushed as (`sha256:...`), or None where it was not pushed
    (or the reference is not one of the console's: another registry's image of the same name and tag is not it)."""
    if not reference.startswith(REGISTRY_PREFIX + "/"):
        return None
    try:
        text = digest_path(reference).read_text().strip()
    except OSError:
        return None
    return text if DIGEST.fullmatch(text) else None


def pullable_digest(reference: str) -> str | None:
    """The pushed digest while the registry's folder still holds it under the reference's tag (a collection by a
    checkout of other recipes may have dropped it): what a node may pull; None sends it to the archive."""
    digest = pushed_digest(reference)
    return digest if digest and _tagged(reference) == digest else None


def forget(reference: str) -> None:
    """The image was built again: what was pushed before under its name is not it."""
    digest_path(reference).unlink(missing_ok=True)


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
    try:
        # Its own answer, not another's on the port: a server that could not listen has exited by then.
        wait_for_port("127.0.0.1", port, 30, process)
    except RuntimeError as error:
        stop(process)
        raise RegistryError(f"the image registry did not start on 127.0.0.1:{port}: {error} (see {log_path})") from None
    return process


@contextmanager
def _push_lock() -> Iterator[None]:
    """One push (or collection) at a time on this host (make run beside make test, two test runs)."""
    folder = Path(settings.IMAGES_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "registry.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _tagged(reference: str) -> str | None:
    """The manifest digest the registry's folder holds under the reference's tag (None: no such tag, as after a
    collection by a checkout whose recipes are other ones)."""
    tag = (storage_dir() / "docker" / "registry" / "v2" / "repositories" / repository_of(reference) / "_manifests"
           / "tags" / reference.rpartition(":")[2] / "current" / "link")
    try:
        return tag.read_text().strip()
    except OSError:
        return None


def _bytes_under(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def collect_garbage(keep: Iterable[str], say: Progress) -> list[str]:
    """Drop every tag of the console's repositories but those of `keep` (the current recipes' references), then
    the manifests and layers no tag reaches any more (`garbage-collect --delete-untagged`); the tags dropped, as
    references. A layer the kept images share (their base) stays. The read-only server may serve meanwhile: a
    node pulls by a digest only while its tag is there (pullable_digest), and a pull cut short by a collection
    falls back to the archive; no writable one runs, under the push lock."""
    found = binary()
    kept = {reference.removeprefix("localhost/") for reference in keep}
    repositories = storage_dir() / "docker" / "registry" / "v2" / "repositories"
    if found is None or not repositories.is_dir():
        return []
    # Written before any tag goes, removed once the layers are collected: a collection that failed is run again
    # by the next build, though no tag is left to drop.
    pending = Path(settings.IMAGES_DIR) / "registry-collect.pending"
    with _push_lock():
        dropped = []
        for tag in sorted(repositories.glob(f"{REGISTRY_PREFIX.split('/', 1)[1]}/*/_manifests/tags/*")):
            name = f"{tag.relative_to(repositories).parts[0]}/{tag.relative_to(repositories).parts[1]}:{tag.name}"
            if name not in kept:
                pending.touch()
                shutil.rmtree(tag)
                dropped.append(f"localhost/{name}")
        if not pending.exists():
            return []
        before = _bytes_under(storage_dir())
        config_file = Path(settings.IMAGES_DIR) / "registry-collect.yml"
        config_file.write_text(config(storage_dir(), 0, read_only=False))
        try:
            done = subprocess.run([found, "garbage-collect", "--delete-untagged", str(config_file)],
                                  capture_output=True, text=True, timeout=COLLECT_SECONDS)
        except subprocess.TimeoutExpired:
            say(f"the console's registry kept its old layers: garbage-collect took over {COLLECT_SECONDS} s (the "
                "next build tries again)")
            return dropped
        if done.returncode != 0:
            say(f"the console's registry kept its old layers: garbage-collect failed ({done.returncode}): "
                f"{(done.stderr or done.stdout)[-500:]} (the next build tries again)")
            return dropped
        pending.unlink()
        freed = (before - _bytes_under(storage_dir())) / 2**20
    say(f"the console's registry dropped {len(dropped)} image(s) no recipe names ({', '.join(dropped) or 'earlier'}): "
        f"{freed:,.0f} MiB freed")
    return dropped


def publish(reference: str, push: Callable[[str, str, Path], None], say: Progress) -> str | None:
    """Push the image to the registry's folder once (its digest kept beside its archive); None where this host
    has no docker-registry or the push failed (nodes then get the archive)."""
    if binary() is None:
        say(f"{reference}: not in a registry (docker-registry is not installed): nodes get its archive")
        return None
    folder = Path(settings.IMAGES_DIR)
    # One push at a time on this host: each its own server and files.
    with _push_lock():
        known = pullable_digest(reference)
        if known:
            return known
        port = free_port()
        started = time.monotonic()
        descriptor, partial = tempfile.mkstemp(dir=folder, prefix=".digest-")
        os.close(descriptor)
        try:
            server = start(folder / "registry-push.yml", port, config(storage_dir(), port, read_only=False),
                           folder / "registry-push.log")
            try:
                push(reference, f"127.0.0.1:{port}/{repository_of(reference)}:{reference.rpartition(':')[2]}",
                     Path(partial))
            finally:
                stop(server)
            if not DIGEST.fullmatch(Path(partial).read_text().strip()):
                raise RegistryError(f"the push of {reference} wrote no digest")
            os.replace(partial, digest_path(reference))
        except (RegistryError, RuntimeError, OSError) as error:
            say(f"{reference}: not in the console's registry ({error}): nodes get its archive")
            return None
        finally:
            Path(partial).unlink(missing_ok=True)
    digest = pushed_digest(reference)
    say(f"{reference}: in the console's registry as {str(digest)[:19]}... ({time.monotonic() - started:.0f} s)")
    return digest
