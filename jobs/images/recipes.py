"""The images the console ships, as recipes: what goes in, and the name and tag that follow from it. Pure."""

import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
REGISTRY_PREFIX = "localhost/training-console"


@dataclass(frozen=True)
class SourceWheel:
    """A wheel built on the host from its sdist with `pip wheel --no-build-isolation` in a build venv."""
    requirement: str  # e.g. "horovod==0.28.1"
    build_requires: tuple[str, ...]  # installed into the build venv first (from the recipe's wheels)
    patches: tuple[tuple[str, str, str], ...] = ()  # (file in the sdist, text, replacement), each must apply
    env: tuple[tuple[str, str], ...] = ()  # the build's variables


@dataclass(frozen=True)
class ImageRecipe:
    name: str  # the engine's image name, e.g. "mpi"
    version: str  # what is inside, in the reference's style: openmpi_4.1-mpi4py-py_3.11-debian_12-x86_64
    packages: tuple[str, ...]  # Debian packages debootstrap installs into the root filesystem
    python: str = "python"  # the interpreter the command names (the image's own)
    # Python packages, as wheels made on the console's host (its pip configuration: local wheels, CA,
    # constraints) and installed offline in the image from the build context's wheels/ folder.
    wheels: tuple[str, ...] = ()  # requirements taken as binary wheels (pip download)
    source_wheels: tuple["SourceWheel", ...] = ()  # built here from their sdist, patched
    # The image this one is built on (FROM), instead of a root filesystem of its own: images that share
    # their parent share its layers, so a node that holds one takes only the others' own layers from the
    # console's registry (jobs.images.registry).
    parent: "ImageRecipe | None" = None

    @property
    def folder(self) -> Path:
        return RECIPES_DIR / self.name

    @property
    def containerfile(self) -> Path:
        return self.folder / "Containerfile"

    def recipe_hash(self) -> str:
        """Changes whenever anything that goes into the image changes."""
        digest = hashlib.sha256()
        for part in (self.name, self.version, DEBIAN_SUITE, " ".join(sorted(self.packages))):
            digest.update(part.encode() + b"\0")
        if self.parent is not None:
            digest.update(b"parent " + self.parent.recipe_hash().encode() + b"\0")
        if self.wheels or self.source_wheels:  # (absent from recipes without wheels: their hash is unchanged)
            digest.update(repr((self.wheels, self.source_wheels)).encode() + b"\0")
        for path in sorted(self.folder.rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(self.folder)).encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()[:12]

    def wheels_hash(self) -> str:
        """What the recipe's wheels depend on only (its Containerfile may change without rebuilding them)."""
        return hashlib.sha256(repr((self.wheels, self.source_wheels, "py_3.11")).encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{self.version}-r{self.recipe_hash()}"

    @property
    def reference(self) -> str:
        return f"{REGISTRY_PREFIX}/{self.name}:{self.tag}"

    @property
    def base_reference(self) -> str:
        """What the Containerfile's FROM is given: the parent's image, or this recipe's own root filesystem."""
        if self.parent is not None:
            return self.parent.reference
        return f"{REGISTRY_PREFIX}/{self.name}-rootfs:{self.tag}"

    def archive_name(self) -> str:
        return f"{self.name}_{self.tag}.tar"


def _machine() -> str:
    return platform.machine() or "x86_64"


# What takes a live rank's Python stacks (`py-spy dump --pid PID`) for a job's evidence (jobs.runtime.evidence).
PY_SPY = "py-spy==0.4.2"

# What every engine image holds, in one image they are all built on (their shared layers): Open MPI and OpenSSH
# (mpirun and the worker's sshd), Python 3.11 with mpi4py and numpy, libgomp (MindSpore's CPU kernels use
# OpenMP and its wheel does not bundle it), the job's account ma-user, and py-spy.
BASE = ImageRecipe(
    name="base",
    version=f"openmpi_4.1-py_3.11-debian_12-{_machine()}",
    packages=("openmpi-bin", "openssh-server", "openssh-client", "python3", "python3-mpi4py", "python3-numpy",
              "procps", "ca-certificates", "python3-pip", "libgomp1"),
    # py-spy (its wheel ships the binary): the evidence of a failed or hung job holds each live rank's stacks.
    wheels=(PY_SPY,),
)

MPI = ImageRecipe(
    name="mpi",
    version=f"openmpi_4.1-mpi4py-py_3.11-debian_12-{_machine()}",
    packages=(),
    parent=BASE,
)

HOROVOD = ImageRecipe(
    name="horovod",
    version=f"horovod_0.28.1-pytorch_2.13.0-cpu-py_3.11-debian_12-{_machine()}",
    packages=(),
    parent=BASE,
    # (py-spy is the base's; kept here so that these wheels, built once per machine, are not made again.)
    wheels=("torch==2.13.0", "numpy<2", "cloudpickle", "psutil", "pyyaml", "packaging", PY_SPY),
    source_wheels=(SourceWheel(
        requirement="horovod==0.28.1",
        build_requires=("torch==2.13.0", "numpy<2", "cloudpickle", "psutil", "pyyaml", "packaging", "setuptools", "wheel"),
        # torch >= 2.1 needs C++17; CMake puts -std=gnu++14 after CXXFLAGS, so only these lines fix it (horovod #3941).
        patches=(("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
                 ("horovod/torch/CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)")),
        env=(("HOROVOD_WITH_MPI", "1"), ("HOROVOD_WITH_GLOO", "1"), ("HOROVOD_WITH_PYTORCH", "1"),
             ("HOROVOD_WITHOUT_TENSORFLOW", "1"), ("HOROVOD_WITHOUT_MXNET", "1"), ("MAKEFLAGS", "-j2")),
    ),),
)

MINDSPORE = ImageRecipe(
    name="mindspore",
    version=f"mindspore_2.10.0-cpu-py_3.11-debian_12-{_machine()}",
    packages=(),
    parent=BASE,
    # Without the pin pip takes numpy 2.x, which MindSpore 2.10.0's compiled parts cannot use.
    wheels=("mindspore==2.10.0", "numpy<2", PY_SPY),
)

SHIPPED = {recipe.name: recipe for recipe in (MPI, HOROVOD, MINDSPORE)}


def archive_name_of(reference: str) -> str:
    """The archive file the builder saves an image reference to (and the runtime looks for)."""
    repository, _, tag = reference.rpartition(":")
    return f"{repository.rsplit('/', 1)[-1]}_{tag}.tar"
