"""The checks an object-store data_url or train_url gets at submission, so a job that could not read its input
or keep its output is refused where the user typed the URL, before it takes any node."""

from __future__ import annotations

from django.utils.translation import gettext as _

from jobs.models import ResourcePool, Storage
from jobs.object_store.client import StoreError
from jobs.object_store.urls import ObjectUrlError, parse_object_url


def object_url_problem(name: str, text: str, user_id: int | None, username: str, pool: ResourcePool | None) -> str:
    """Why `text`, typed as data_url or train_url, cannot be used ("" when it can, or when it is a path)."""
    try:
        url = parse_object_url(text)
        if url is None:
            return ""
        if user_id is None:
            return _("Sign in to use an object store.")
        where = Storage.reach_for(text, pool.pk if pool else None, user_id, username)
        if name == "data_url":
            if not where.store.bucket_exists(url.bucket):
                return _("Bucket %(bucket)s does not exist yet: put your data in it first.") % {
                    "bucket": url.bucket}
            if not where.store.has_any(url.bucket, url.folder_prefix):
                return _("Nothing is stored under %(url)s.") % {"url": text}
        else:
            # The user's own bucket is made on first use, as the platform's output buckets are the user's.
            where.store.create_bucket(url.bucket)
    except (ObjectUrlError, StoreError) as error:
        return str(error)
    return ""
