"""Which store and bucket a user's object URL reaches, with which keys, and whether they may (shared by the form
and the run).

With a store's own keys, a user reaches only their own bucket (Storage.user_bucket): the keys could read
every bucket, so the console checks the bucket before it lists, presigns or caches anything for the user.
Any other bucket is reached only with the user's own keys to the store, where the store takes them: then the
store itself decides what the user may read or write, as it would outside the console. Another user's bucket
stays out of reach whatever keys are given, since the console made it with the store's keys for that user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from django.urls import reverse
from django.utils.translation import gettext as _

from jobs.object_store.client import ObjectStore, StoreAccess
from jobs.object_store.urls import ObjectUrl, ObjectUrlError, parse_object_url


class StorageRecord(Protocol):
    """What this module needs of a Storage row (jobs.models.Storage has it)."""

    name: str
    user_bucket_prefix: str
    users_may_bring_keys: bool

    def access(self) -> StoreAccess: ...

    def user_bucket(self, user_id: int, username: str) -> str: ...


@dataclass(frozen=True)
class Reach:
    """A user's object URL, the store it names and the client to it, once the user may use it."""

    url: ObjectUrl
    store: ObjectStore
    storage_name: str
    endpoint_url: str
    # Reached with the user's own keys: the store, not the console, decided the user may list it, so whatever
    # a node's cache holds of it is handed over only once the store takes the user's keys for that object.
    with_own_keys: bool = False


def reach(text: str, storage: StorageRecord | None, user_id: int, username: str,
          own_keys: StoreAccess | None = None) -> Reach:
    """The store and bucket `text` names for this user, with `own_keys` (the user's keys to that store, if they
    set any) for a bucket not theirs; ObjectUrlError in words a user can act on."""
    url = parse_object_url(text)
    if url is None:
        raise ObjectUrlError(_("%(text)r is not an object URL") % {"text": text})
    if storage is None:
        raise ObjectUrlError(_("No object store of this console answers to %(scheme)s://.") % {"scheme": url.scheme})
    own = storage.user_bucket(user_id, username)
    if url.bucket == own:
        access = storage.access()
        return Reach(url, ObjectStore(access), storage.name, access.endpoint_url)
    refusal = _("Bucket %(bucket)s is not yours: in the %(store)s store yours is %(own)s.") % {
        "bucket": url.bucket, "store": storage.name, "own": f"{url.scheme}://{own}/"}
    if _is_a_users_bucket(url.bucket, storage.user_bucket_prefix):
        raise ObjectUrlError(refusal)
    if not storage.users_may_bring_keys:
        raise ObjectUrlError(refusal)
    if own_keys is None:
        raise ObjectUrlError(refusal + " " + _("To reach other buckets of this store, add your own keys to it on the "
                                               "Object-store keys page (%(page)s).") % {"page": reverse("store-keys")})
    return Reach(url, ObjectStore(own_keys), storage.name, own_keys.endpoint_url, with_own_keys=True)


def _is_a_users_bucket(bucket: str, prefix: str) -> bool:
    """Whether the bucket has the shape of one the console makes for a user (<prefix><user id>-<name>)."""
    return re.fullmatch(re.escape(prefix) + r"[0-9]+(-[a-z0-9-]*)?", bucket) is not None
