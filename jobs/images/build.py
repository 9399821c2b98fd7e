"""Building the shipped images on the console's host, offline but for Debian's packages, idempotently.

A build is: debootstrap --variant=minbase with the recipe's packages into a scratch folder, `podman
import` of that tree as the root-filesystem image, `podman build` of the recipe's Containerfile on top,
and `podman save` into the archive nodes are given. Each step is skipped when its result for this
recipe hash is already there, so a second build of an unchanged recipe costs a few `podman` calls.
"""

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from jobs.images.recipes import DEBIAN_MIRROR, DEBIAN_SUITE, ImageRecipe

CONTAINERS_CONF = Path(__file__).resolve().parent / "containers.conf"

Progress = Callable[[str], None]


class ImageBuildError(RuntimeError):
    pass


def images_dir() -> Path:
    return Path(settings.IMAGES_DIR)


def archive_path(recipe: ImageRecipe) -> Path:
    return images_dir() / recipe.archive_name()


def podman(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
    """Podman with the builder's own store, so building touches no node's images."""
    root = images_dir() / "store"
    command = ["podman", "--root", str(root), "--runroot", str(images_dir() / "run"), *args]
    result = subprocess.run(command, capture_output=capture, text=True,
                            env={**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)})
    if check and result.returncode != 0:
        raise ImageBuildError(f"{' '.join(command[5:7])} failed ({result.returncode}): {(result.stderr or '')[-2000:]}")
    return result


def image_exists(reference: str) -> bool:
    return podman("image", "exists", reference, check=False).returncode == 0


def build(recipe: ImageRecipe, say: Progress = print) -> Path:
    """The recipe's image archive, built if this recipe hash has none yet."""
    archive = archive_path(recipe)
    if archive.is_file():
        say(f"{recipe.reference}: up to date ({archive.name})")
        return archive
    for tool in ("podman", "debootstrap"):
        if shutil.which(tool) is None:
            raise ImageBuildError(f"{tool} is not installed (make run and make test install it)")
    images_dir().mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if not image_exists(recipe.reference):
        if not image_exists(recipe.base_reference):
            _root_filesystem(recipe, say)
        say(f"{recipe.reference}: podman build {recipe.containerfile.relative_to(recipe.folder.parents[1])}")
        podman("build", "--network", "none", "--build-arg", f"BASE={recipe.base_reference}",
               "-t", recipe.reference, "-f", str(recipe.containerfile), str(recipe.folder))
    say(f"{recipe.reference}: saving {archive.name}")
    partial = archive.with_suffix(".tar.partial")
    partial.unlink(missing_ok=True)
    podman("save", "--format", "docker-archive", "-o", str(partial), recipe.reference)
    partial.replace(archive)
    for stale in images_dir().glob(f"{recipe.name}_*.tar"):
        if stale != archive:
            stale.unlink()
    say(f"{recipe.reference}: built in {time.monotonic() - started:.0f} s, {archive.stat().st_size / 2**20:.0f} MiB")
    return archive


def _root_filesystem(recipe: ImageRecipe, say: Progress) -> None:
    scratch = images_dir() / "rootfs" / recipe.tag
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    say(f"{recipe.reference}: debootstrap {DEBIAN_SUITE} with {', '.join(recipe.packages)} (about a minute)")
    step = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(recipe.packages)}",
                           DEBIAN_SUITE, str(scratch), DEBIAN_MIRROR], capture_output=True, text=True)
    if step.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise ImageBuildError(f"debootstrap failed ({step.returncode}): {(step.stdout + step.stderr)[-2000:]}")
    say(f"{recipe.reference}: podman import of the root filesystem")
    with subprocess.Popen(["tar", "-C", str(scratch), "-c", "."], stdout=subprocess.PIPE) as tar:
        result = subprocess.run(
            ["podman", "--root", str(images_dir() / "store"), "--runroot", str(images_dir() / "run"),
             "import", "-", recipe.base_reference],
            stdin=tar.stdout, capture_output=True, text=True, env={**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)})
    shutil.rmtree(scratch, ignore_errors=True)
    if result.returncode != 0:
        raise ImageBuildError(f"podman import failed: {result.stderr[-2000:]}")
