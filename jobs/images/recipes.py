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
class ImageRecipe:
    name: str  # the engine's image name, e.g. "mpi"
    version: str  # what is inside, in the reference's style: openmpi_4.1-mpi4py-py_3.11-debian_12-x86_64
    packages: tuple[str, ...]  # Debian packages debootstrap installs into the root filesystem
    python: str = "python"  # the interpreter the command names (the image's own)

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
        for path in sorted(self.folder.rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(self.folder)).encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{self.version}-r{self.recipe_hash()}"

    @property
    def reference(self) -> str:
        return f"{REGISTRY_PREFIX}/{self.name}:{self.tag}"

    @property
    def base_reference(self) -> str:
        return f"{REGISTRY_PREFIX}/{self.name}-rootfs:{self.tag}"

    def archive_name(self) -> str:
        return f"{self.name}_{self.tag}.tar"


def _machine() -> str:
    return platform.machine() or "x86_64"


MPI = ImageRecipe(
    name="mpi",
    version=f"openmpi_4.1-mpi4py-py_3.11-debian_12-{_machine()}",
    packages=("openmpi-bin", "openssh-server", "openssh-client", "python3", "python3-mpi4py", "python3-numpy",
              "procps", "ca-certificates"),
)

SHIPPED = {recipe.name: recipe for recipe in (MPI,)}


def archive_name_of(reference: str) -> str:
    """The archive file the builder saves an image reference to (and the runtime looks for)."""
    repository, _, tag = reference.rpartition(":")
    return f"{repository.rsplit('/', 1)[-1]}_{tag}.tar"
