"""Puts in what a fresh console needs: an admin, the engines, the launcher defaults, the examples."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from jobs.code_dirs.service import register_examples
from jobs.images.recipes import MPI, SHIPPED
from jobs.models import Engine, EngineVersion, LauncherDefaults

PRE_CONTAINER_MPI_VERSION = "openmpi_4.1-mpi4py-numpy-py_3.11-debian_12-x86_64"


class Command(BaseCommand):
    help = "Create the admin account (printing its password once), the engines and the example code directories."

    def add_arguments(self, parser):
        parser.add_argument("--admin", default="admin")
        parser.add_argument("--password", default="", help="default: a random one, printed")

    def handle(self, *args, admin, password, **options):
        users = get_user_model()
        if not users.objects.filter(username=admin).exists():
            password = password or secrets.token_urlsafe(12)
            users.objects.create_superuser(admin, f"{admin}@localhost", password)
            self.stdout.write(self.style.SUCCESS(f"admin account: {admin} / {password}"))
        else:
            self.stdout.write(f"admin account {admin!r} exists (password unchanged)")
        for name in ("Horovod", "MPI", "MindSpore-GPU"):
            Engine.objects.get_or_create(name=name)
        # The shipped MPI image (make run builds it): each worker is a container of it, "python" its own.
        mpi = Engine.objects.get(name="MPI")
        EngineVersion.objects.update_or_create(engine=mpi, version=MPI.version,
                                               defaults={"image": MPI.reference, "python": MPI.python})
        # The other shipped engines' images (Horovod on PyTorch CPU, MindSpore CPU), each its engine's version.
        for recipe_name, engine_name in (("horovod", "Horovod"), ("mindspore", "MindSpore-GPU")):
            recipe = SHIPPED.get(recipe_name)
            if recipe is not None:
                EngineVersion.objects.update_or_create(engine=Engine.objects.get(name=engine_name), version=recipe.version,
                                                       defaults={"image": recipe.reference, "python": recipe.python})
        # The version consoles made before workers were containers ran the nodes' own Python: now the image's.
        EngineVersion.objects.filter(engine=mpi, version=PRE_CONTAINER_MPI_VERSION, image="").update(
            image=MPI.reference, python=MPI.python)
        LauncherDefaults.current()
        names = [code_dir.name for code_dir in register_examples()]
        self.stdout.write(f"example code directories: {', '.join(names) or 'none'}")
