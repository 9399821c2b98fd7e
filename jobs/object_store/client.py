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

    # A file too large for one PUT (S3 and OBS take at most 5 GiB that way) goes in parts: the console opens the
    # upload and signs one URL a part, the node PUTs the parts and hands back their ETags, the console completes
    # it, or aborts it so that no part is left taking room in the store.

    def start_multipart(self, bucket: str, key: str) -> str:
        """A new multipart upload's id."""
        try:
            return str(self.client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
            raise _words(error, f"{bucket}/{key}") from error

    def presigned_part(self, bucket: str, key: str, upload_id: str, number: int, expires_s: int) -> str:
        return str(self.client.generate_presigned_url(
            "upload_part", Params={"Bucket": bucket, "Key": key, "UploadId": upload_id, "PartNumber": number},
            ExpiresIn=expires_s))

    def complete_multipart(self, bucket: str, key: str, upload_id: str, etags: list[str]) -> None:
        """Join the parts, numbered from 1 in the order of `etags`, into the object."""
        parts = [{"PartNumber": number, "ETag": etag} for number, etag in enumerate(etags, start=1)]
        try:
            self.client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
            raise _words(error, f"{bucket}/{key}") from error

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
            raise _words(error, f"{bucket}/{key}") from error

    def open_multipart_uploads(self, bucket: str, prefix: str) -> list[tuple[str, str]]:
        """(key, upload id) of the uploads under prefix that were neither completed nor aborted."""
        try:
            answer = self.client.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
            raise _words(error, f"{bucket}/{prefix}") from error
        return [(str(item["Key"]), str(item["UploadId"])) for item in answer.get("Uploads", [])]
