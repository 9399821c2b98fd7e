"""A small typed client of an S3-compatible object store, on boto3 (any endpoint, path-style or virtual-host).

Every call answers in the store's own words or raises StoreError with a sentence a user can act on: the
bucket does not exist, the keys were refused, the store did not answer. Presigned URLs let a node move the
bytes itself (never through the console) while the keys stay in the console.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import boto3
import botocore.config
import botocore.exceptions
from django.utils.translation import gettext as _

CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 20.0


class StoreError(Exception):
    """The store said no, or could not be asked; the message says which, in words."""


class StoreUnreachable(StoreError):
    """No answer from the store's endpoint."""


@dataclass(frozen=True)
class StoreAccess:
    """Where a store is and the keys to it (plain values: the models open the sealed keys into these)."""

    endpoint_url: str
    # Never in a repr (a log line, a traceback's locals).
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    path_style: bool = True


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    etag: str


def _words(error: Exception, what: str) -> StoreError:
    if isinstance(error, botocore.exceptions.EndpointConnectionError | botocore.exceptions.ConnectTimeoutError |
                  botocore.exceptions.ReadTimeoutError):
        return StoreUnreachable(_("The object store did not answer (%(what)s).") % {"what": what})
    if isinstance(error, botocore.exceptions.ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchBucket", "404", "NotFound"):
            return StoreError(_("%(what)s: the bucket does not exist.") % {"what": what})
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden"):
            return StoreError(_("%(what)s: the store refused the keys.") % {"what": what})
        return StoreError(_("%(what)s: the store said %(said)s.") % {"what": what, "said": code or error})
    return StoreError(f"{what}: {error}")


class ObjectStore:
    def __init__(self, access: StoreAccess) -> None:
        self.access = access
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=access.endpoint_url, region_name=access.region,
            aws_access_key_id=access.access_key, aws_secret_access_key=access.secret_key,
            config=botocore.config.Config(
                s3={"addressing_style": "path" if access.path_style else "virtual"},
                connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                retries={"max_attempts": 2, "mode": "standard"}, signature_version="s3v4"),
        )

    def bucket_exists(self, bucket: str) -> bool:
        try:
            self.client.head_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError as error:
            if str(error.response.get("Error", {}).get("Code", "")) in ("404", "NoSuchBucket", "NotFound"):
                return False
            raise _words(error, f"bucket {bucket}") from error
        except botocore.exceptions.BotoCoreError as error:
            raise _words(error, f"bucket {bucket}") from error
        return True

    def create_bucket(self, bucket: str) -> None:
        try:
            if not self.bucket_exists(bucket):
                self.client.create_bucket(Bucket=bucket)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
            raise _words(error, f"creating bucket {bucket}") from error

    def objects(self, bucket: str, prefix: str, limit: int) -> Iterator[StoredObject]:
        """The objects under prefix, at most limit of them (StoreError past it: the caller names the limit)."""
        count = 0
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    count += 1
                    if count > limit:
                        raise StoreError(_("%(url)s holds more than %(limit)s objects.") % {"url": f"s3://{bucket}/{prefix}", "limit": limit})
                    yield StoredObject(str(item["Key"]), int(item["Size"]), str(item.get("ETag", "")).strip('"'))
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
            raise _words(error, f"listing {bucket}/{prefix}") from error

    def browse(self, bucket: str, prefix: str, start_after: str, limit: int) -> tuple[list[str], list[StoredObject], bool]:
        """One level under prefix, as a folder browser shows it: (sub-folders, objects, whether there is more)."""
        try:
            answer = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/", MaxKeys=limit,
                                                 **({"StartAfter": start_after} if start_after else {}))
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
            raise _words(error, f"{bucket}/{prefix}") from error
        folders = [str(item["Prefix"]) for item in answer.get("CommonPrefixes", [])]
        objects = [StoredObject(str(item["Key"]), int(item["Size"]), str(item.get("ETag", "")).strip('"'))
                   for item in answer.get("Contents", []) if str(item["Key"]) != prefix]
        return folders, objects, bool(answer.get("IsTruncated"))

    def head(self, bucket: str, key: str) -> StoredObject | None:
        try:
            answer = self.client.head_object(Bucket=bucket, Key=key)
        except botocore.exceptions.ClientError as error:
            if str(error.response.get("Error", {}).get("Code", "")) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise _words(error, f"{bucket}/{key}") from error
        except botocore.exceptions.BotoCoreError as error:
            raise _words(error, f"{bucket}/{key}") from error
        return StoredObject(key, int(answer["ContentLength"]), str(answer.get("ETag", "")).strip('"'))

    def has_any(self, bucket: str, prefix: str) -> bool:
        try:
            answer = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
            raise _words(error, f"{bucket}/{prefix}") from error
        return bool(answer.get("Contents"))

    def presigned_get(self, bucket: str, key: str, expires_s: int) -> str:
        return str(self.client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s))

    def presigned_put(self, bucket: str, key: str, expires_s: int) -> str:
        return str(self.client.generate_presigned_url(
            "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s))
