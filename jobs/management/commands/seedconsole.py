"""Puts in what a fresh console needs: an admin, the engines, the launcher defaults, the examples."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from jobs.code_dirs import register_examples
from jobs.models import Engine, EngineVersion, LauncherDefaults

LOCAL_MPI_VERSION = "openmpi_4.1-mpi4py-numpy-py_3.11-debian_12-x86_64"


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
        # Debian's python3 with mpi4py and numpy, the interpreter the local cluster's nodes have.
        EngineVersion.objects.get_or_create(
            engine=Engine.objects.get(name="MPI"), version=LOCAL_MPI_VERSION, defaults={"python": "/usr/bin/python3"}
        )
        LauncherDefaults.current()
        names = [code_dir.name for code_dir in register_examples()]
        self.stdout.write(f"example code directories: {', '.join(names) or 'none'}")
