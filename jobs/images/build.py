"""Building the shipped images on the console's host, offline but for Debian's packages, idempotently.

A build is: the recipe's parent image first (the base all engine images share), or, for the base,
debootstrap --variant=minbase with its packages into a scratch folder and `podman import` of that tree as
its root-filesystem image; then `podman build` of the recipe's Containerfile on top, `podman save` into the
archive nodes may be given, and a push into the console's registry (jobs.images.registry), from which nodes
pull the layers they lack. Each step is skipped when its result for this recipe hash is already there, so a
second build of an unchanged recipe costs a few `podman` calls.

A recipe with Python packages gets them as wheels made here first, with this host's pip and its
configuration (local wheels, CA, constraints) and Debian's /usr/bin/python3 (the image's Python 3.11
and glibc): binary wheels downloaded, and source ones (Horovod) built from their patched sdist in a
build venv. They are kept in IMAGES_DIR/wheels/<name>-<hash of what they depend on>/ (a Containerfile
change rebuilds no wheel) and copied into the build context, where the Containerfile installs them
with `pip install --no-index`, the build itself staying offline.
"""

import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from jobs.images import registry
from jobs.images.recipes import DEBIAN_MIRROR, DEBIAN_SUITE, ImageRecipe, SourceWheel, archive_name_of

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
    # Made here first: podman makes a missing --root with every folder above it 0700, the console's own folder
    # included, which would shut the local Slurm's daemons (their own users) out of their folders beside it.
    images_dir().mkdir(parents=True, exist_ok=True)
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
    """The recipe's image archive, built if this recipe hash has none yet, and the image in the console's registry
    (jobs.images.registry) where this host has one."""
    archive = archive_path(recipe)
    if archive.is_file():
        say(f"{recipe.reference}: up to date ({archive.name})")
    else:
        started = time.monotonic()
        _image(recipe, say)
        say(f"{recipe.reference}: saving {archive.name}")
        partial = archive.with_suffix(".tar.partial")
        partial.unlink(missing_ok=True)
        podman("save", "--format", "docker-archive", "-o", str(partial), recipe.reference)
        partial.replace(archive)
        registry.forget(recipe.reference)  # (a digest kept from an earlier build of this tag is not this image's)
        for stale in images_dir().glob(f"{recipe.name}_*.tar"):
            if stale != archive:
                stale.unlink()
        say(f"{recipe.reference}: built in {time.monotonic() - started:.0f} s, {archive.stat().st_size / 2**20:.0f} MiB")
    registry.publish(recipe.reference, _push, say)
    for stale in images_dir().glob(f"{recipe.name}_*.digest"):
        if stale != registry.digest_path(recipe.reference):
            stale.unlink()
    return archive


def _push(source: str, destination: str, digest_file: Path) -> None:
    if not image_exists(source):  # an archive kept from an earlier build, its builder's store since emptied
        podman("load", "--quiet", "--input", str(images_dir() / archive_name_of(source)))
    # zstd: a node's pull spends its time unpacking layers, and zstd unpacks several times faster than gzip.
    podman("push", "--quiet", "--tls-verify=false", "--compression-format", "zstd", "--digestfile", str(digest_file),
           source, destination)


def _image(recipe: ImageRecipe, say: Progress) -> None:
    """The recipe's image in the builder's store, its parent's built first."""
    if image_exists(recipe.reference):
        return
    for tool in ("podman", "debootstrap"):
        if shutil.which(tool) is None:
            raise ImageBuildError(f"{tool} is not installed (make run and make test install it)")
    images_dir().mkdir(parents=True, exist_ok=True)
    if recipe.parent is not None:
        _image(recipe.parent, say)
    elif not image_exists(recipe.base_reference):
        _root_filesystem(recipe, say)
    context = recipe.folder
    if recipe.wheels or recipe.source_wheels:
        context = _context_with_wheels(recipe, _wheels(recipe, say))
    say(f"{recipe.reference}: podman build {recipe.containerfile.relative_to(recipe.folder.parents[1])}")
    podman("build", "--network", "none", "--build-arg", f"BASE={recipe.base_reference}",
           "-t", recipe.reference, "-f", str(recipe.containerfile), str(context))
    if context != recipe.folder:
        shutil.rmtree(context, ignore_errors=True)


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


HOST_PYTHON = "/usr/bin/python3"  # Debian's: the same Python 3.11 and glibc as the images


def _run_step(what: str, command: list[str], *, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise ImageBuildError(f"{what} failed ({result.returncode}): {(result.stdout + result.stderr)[-3000:]}")


def _wheels(recipe: ImageRecipe, say: Progress) -> Path:
    """The recipe's wheels, made once per hash of their inputs (the folder is complete once its marker is there)."""
    folder = images_dir() / "wheels" / f"{recipe.name}-{recipe.wheels_hash()}"
    if (folder / ".complete").is_file():
        say(f"{recipe.reference}: wheels up to date ({folder})")
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for stale in folder.parent.glob(f"{recipe.name}-*"):
        if stale != folder:
            shutil.rmtree(stale, ignore_errors=True)
    pip = [HOST_PYTHON, "-m", "pip"]
    if recipe.wheels:
        say(f"{recipe.reference}: pip download {' '.join(recipe.wheels)} (wheels for Python 3.11)")
        started = time.monotonic()
        _run_step("pip download", [*pip, "download", "--only-binary", ":all:", "-d", str(folder), *recipe.wheels])
        say(f"{recipe.reference}: wheels downloaded in {time.monotonic() - started:.0f} s")
    for source in recipe.source_wheels:
        _source_wheel(recipe, source, folder, say)
    if recipe.source_wheels:  # what the built wheels need besides (Horovod: cffi), as binary wheels too
        built = [str(path) for path in folder.glob("*.whl") if "-linux_" in path.name]
        _run_step("pip download of the built wheels' dependencies",
                  [*pip, "download", "--only-binary", ":all:", "--find-links", str(folder), "-d", str(folder), *built])
    (folder / ".complete").write_text("")
    return folder


def _source_wheel(recipe: ImageRecipe, source: SourceWheel, folder: Path, say: Progress) -> None:
    work = images_dir() / "wheels-build" / recipe.name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        say(f"{recipe.reference}: build venv with {' '.join(source.build_requires)}")
        _run_step("the build venv", [HOST_PYTHON, "-m", "venv", str(work / "venv")])
        venv_pip = [str(work / "venv" / "bin" / "python"), "-m", "pip"]
        # From the wheels folder where it has them (torch), else from the index (setuptools, wheel).
        _run_step("the build venv's packages", [*venv_pip, "install", "-q", "--find-links", str(folder), *source.build_requires])
        say(f"{recipe.reference}: pip download the sdist of {source.requirement}")
        _run_step("pip download of the sdist", [*venv_pip, "download", "--no-deps", "--no-binary", ":all:",
                                               "-d", str(work / "sdist"), source.requirement])
        archive, = (work / "sdist").glob("*.tar.gz")
        with tarfile.open(archive) as sdist:
            members = sdist.getmembers()
            for member in members:  # PyPI's own sdist, but still: plain files and folders inside the tree only
                if member.name.startswith("/") or ".." in Path(member.name).parts or not (member.isfile() or member.isdir()):
                    raise ImageBuildError(f"{archive.name} holds {member.name!r}, which is not a plain file or folder inside it")
            sdist.extractall(work / "src", members=members)
        tree, = (work / "src").iterdir()
        for name, text, replacement in source.patches:
            path = tree / name
            content = path.read_text()
            if text not in content:
                raise ImageBuildError(f"the patch of {name} in {source.requirement} no longer applies: {text!r} is not there")
            path.write_text(content.replace(text, replacement))
        say(f"{recipe.reference}: pip wheel {source.requirement} from its sdist (several minutes)")
        started = time.monotonic()
        _run_step(f"the wheel of {source.requirement}",
                  [*venv_pip, "wheel", "--no-build-isolation", "--no-deps", "-w", str(folder), str(tree)],
                  env=dict(source.env))
        say(f"{recipe.reference}: {source.requirement} built in {time.monotonic() - started:.0f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _context_with_wheels(recipe: ImageRecipe, wheels: Path) -> Path:
    """A build context: the recipe's folder and its wheels (hard links where the file system allows)."""
    context = images_dir() / "context" / recipe.tag
    shutil.rmtree(context, ignore_errors=True)
    shutil.copytree(recipe.folder, context)
    target = context / "wheels"
    target.mkdir()
    for wheel in wheels.glob("*.whl"):
        try:
            os.link(wheel, target / wheel.name)
        except OSError:
            shutil.copy2(wheel, target / wheel.name)
    return context
