"""Which store and bucket a user's object URL reaches, and whether they may (shared by the form and the run).

With a store's own keys, a user reaches only their own bucket (Storage.user_bucket): the keys could read
every bucket, so the console checks the bucket before it lists, presigns or caches anything for the user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from django.utils.translation import gettext as _

from jobs.object_store.client import ObjectStore, StoreAccess
from jobs.object_store.urls import ObjectUrl, ObjectUrlError, parse_object_url


class StorageRecord(Protocol):
    """What this module needs of a Storage row (jobs.models.Storage has it)."""

    name: str

    def access(self) -> StoreAccess: ...

    def user_bucket(self, user_id: int, username: str) -> str: ...


@dataclass(frozen=True)
class Reach:
    """A user's object URL, the store it names and the client to it, once the user may use it."""

    url: ObjectUrl
    store: ObjectStore
    storage_name: str
    endpoint_url: str


def reach(text: str, storage: StorageRecord | None, user_id: int, username: str) -> Reach:
    """The store and bucket `text` names for this user; ObjectUrlError in words a user can act on."""
    url = parse_object_url(text)
    if url is None:
        raise ObjectUrlError(_("%(text)r is not an object URL") % {"text": text})
    if storage is None:
        raise ObjectUrlError(_("No object store of this console answers to %(scheme)s://.") % {"scheme": url.scheme})
    own = storage.user_bucket(user_id, username)
    if url.bucket != own:
        raise ObjectUrlError(_("Bucket %(bucket)s is not yours: in the %(store)s store yours is %(own)s.")
                             % {"bucket": url.bucket, "store": storage.name, "own": f"{url.scheme}://{own}/"})
    access = storage.access()
    return Reach(url, ObjectStore(access), storage.name, access.endpoint_url)
