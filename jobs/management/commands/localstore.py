"""`localstore register ENDPOINT`: the console's own SeaweedFS (jobs.localstore) as the storage "local"."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from jobs import localstore
from jobs.models import Storage


def register(endpoint: str, state_dir: Path) -> Storage:
    """The local store as a storage every pool may use, with the keys kept in its folder."""
    made = localstore.keys(state_dir)
    # An administrator who turned the local store off keeps it off: only its address and keys are renewed.
    storage, _ = Storage.objects.get_or_create(name=localstore.STORAGE_NAME, defaults={"endpoint_url": endpoint})
    storage.endpoint_url = endpoint
    storage.set_keys(made.access_key, made.secret_key)
    storage.full_clean()
    storage.save()
    return storage


def other_store_configured() -> bool:
    """An administrator's own store is the default one: the local one is then not started."""
    return Storage.objects.filter(enabled=True).exclude(name=localstore.STORAGE_NAME).exists()


class Command(BaseCommand):
    help = "Register the console's own object store (SeaweedFS) as the storage 'local'."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["register"])
        parser.add_argument("endpoint", help="the store's S3 endpoint, e.g. http://10.77.0.1:8333")

    def handle(self, *args: object, action: str, endpoint: str, **options: object) -> None:
        storage = register(endpoint, Path(settings.LOCALSTORE_STATE_DIR))
        self.stdout.write(f"storage {storage.name}: {storage.endpoint_url} (s3:// and obs://, a bucket per user)")
