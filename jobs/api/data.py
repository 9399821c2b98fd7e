"""The user's data in the object stores: browse their buckets, and links to put and get files.

The bytes never pass through the console: it signs a URL for each object (good for minutes), and the
browser, `tc data push` or `tc data get` talk to the store with it. A user reaches their own bucket, and
others only with their own keys to the store (jobs.object_store.access), as the jobs' data_url and train_url do.
"""

from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.models import Storage, usable_in_pool
from jobs.object_store.access import Reach
from jobs.object_store.client import StoreError
from jobs.object_store.urls import ObjectUrlError, parse_object_url, safe_key_part
from jobs.row_ids import row_id

LINK_SECONDS = 900
BROWSE_PAGE = 200
MAX_LINKS = 1000


def _pool_of(request) -> int | None:
    """The pool the user's job is for (`pool`, its number): the stores its jobs may use are those shown; none,
    or "": every store, as for a job of no pool."""
    text = str(request.query_params.get("pool", "")).strip()
    if not text:
        return None
    number = row_id(text)
    if number is None:
        raise ValidationError({"pool": [_("Give the pool's number.")]})
    return number


def _reach(request, text: str, field: str = "url", pool_id: int | None = None) -> Reach:
    try:
        url = parse_object_url(text)
        if url is None:
            raise ObjectUrlError(f"{text!r} is not an object URL (s3://bucket/folder/ or obs://bucket/folder/)")
        return Storage.reach_for(text, pool_id, request.user.pk, request.user.get_username())
    except (ObjectUrlError, StoreError) as error:
        raise ValidationError({field: [str(error)]}) from error


class BucketSerializer(serializers.Serializer):
    storage = serializers.CharField(help_text="The store's name.")
    url = serializers.CharField(help_text="The user's own bucket in it, as data_url and train_url name it.")


class StoredObjectSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="The object's full key.")
    name = serializers.CharField(help_text="Its name under the folder browsed.")
    size = serializers.IntegerField(help_text="Bytes.")


class BrowseSerializer(serializers.Serializer):
    url = serializers.CharField(allow_blank=True, help_text="The folder browsed; blank: the user's buckets.")
    buckets = BucketSerializer(many=True, help_text="The user's bucket in each store.")
    folders = serializers.ListField(child=serializers.CharField(), help_text="Sub-folders, as URLs.")
    objects = StoredObjectSerializer(many=True, help_text="The objects directly in the folder.")
    more = serializers.BooleanField(help_text="More entries: ask again with `after` set to the last key.")


class UploadLinksRequestSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=1024, help_text="The folder to upload into, e.g. s3://user-3-alice/data/.")
    # Read as they come and checked in the view: a child field's errors would be keyed by index, and an
    # error here is {field: [messages]} like every other.
    paths = serializers.JSONField(help_text=(
        f"A list of the files' paths under the folder (strings, with '/'); 1 to {MAX_LINKS} a request."))

    def validate_paths(self, paths: object) -> list[str]:
        if not isinstance(paths, list) or not 1 <= len(paths) <= MAX_LINKS:
            raise serializers.ValidationError(f"Give a list of 1 to {MAX_LINKS} paths.")
        bad = [path for path in paths if not isinstance(path, str) or len(path) > 1024 or not safe_key_part(path)]
        if bad:
            raise serializers.ValidationError([f"{path!r} cannot be an object's key (an empty, '.' or '..' part, or a "
                                               "control character)." for path in bad[:5]])
        return paths


class LinkSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="The file's path under the folder.")
    url = serializers.CharField(help_text="A presigned PUT URL for it, good for 15 minutes.")


class UploadLinksSerializer(serializers.Serializer):
    links = LinkSerializer(many=True, help_text="One link per file asked for, in the same order.")


class DownloadLinkSerializer(serializers.Serializer):
    url = serializers.CharField(help_text="A presigned GET URL, good for 15 minutes.")
    size = serializers.IntegerField(help_text="The object's bytes.")


class DataBrowse(APIView):
    @extend_schema(summary="The user's buckets, or one folder of one of them", responses=BrowseSerializer,
                   parameters=[OpenApiParameter("url", str, description="s3:// or obs:// folder; none: the buckets"),
                               OpenApiParameter("after", str, description="Continue after this key."),
                               OpenApiParameter("pool", int, description="Only the stores a job of this pool may use.")])
    def get(self, request):
        pool_id = _pool_of(request)
        buckets = [{"storage": storage.name,
                    "url": f"{storage.schemes.split()[0]}://{storage.user_bucket(request.user.pk, request.user.get_username())}/"}
                   for storage in usable_in_pool(Storage.objects.all(), pool_id, any_without_pool=True)]
        text = str(request.query_params.get("url", "")).strip()
        if not text:
            return Response({"url": "", "buckets": buckets, "folders": [], "objects": [], "more": False})
        where = _reach(request, text, pool_id=pool_id)
        prefix = where.url.folder_prefix
        try:
            if not where.store.bucket_exists(where.url.bucket):
                if where.with_own_keys:  # another bucket, reached with the user's keys: it is not there
                    raise ValidationError({"url": [_("The %(store)s store has no bucket %(bucket)s.") % {
                        "store": where.storage_name, "bucket": where.url.bucket}]})
                # The user's own bucket, not made yet (it is on the first upload): empty, not an error.
                return Response({"url": f"{where.url.scheme}://{where.url.bucket}/{prefix}", "buckets": buckets,
                                 "folders": [], "objects": [], "more": False})
            folders, objects, more = where.store.browse(where.url.bucket, prefix,
                                                         str(request.query_params.get("after", "")), BROWSE_PAGE)
        except StoreError as error:
            raise ValidationError({"url": [str(error)]}) from error
        base = f"{where.url.scheme}://{where.url.bucket}/"
        return Response({"url": base + prefix, "buckets": buckets, "folders": [base + folder for folder in folders],
                         "objects": [{"key": item.key, "name": item.key[len(prefix):], "size": item.size}
                                     for item in objects], "more": more})


class DataUploadLinks(APIView):
    @extend_schema(summary="Presigned PUT links to upload files into one of the user's folders",
                   request=UploadLinksRequestSerializer, responses=UploadLinksSerializer)
    def post(self, request):
        body = UploadLinksRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        paths = body.validated_data["paths"]
        where = _reach(request, body.validated_data["url"])
        try:
            where.store.create_bucket(where.url.bucket)
        except StoreError as error:
            raise ValidationError({"url": [str(error)]}) from error
        return Response({"links": [
            {"path": path, "url": where.store.presigned_put(where.url.bucket, where.url.folder_prefix + path, LINK_SECONDS)}
            for path in paths]})


class DataDownloadLink(APIView):
    @extend_schema(summary="A presigned GET link to one of the user's objects", responses=DownloadLinkSerializer,
                   parameters=[OpenApiParameter("url", str, required=True, description="s3:// or obs:// object")])
    def get(self, request):
        where = _reach(request, str(request.query_params.get("url", "")))
        key = where.url.prefix
        try:
            found = where.store.head(where.url.bucket, key) if key and not key.endswith("/") else None
        except StoreError as error:
            raise ValidationError({"url": [str(error)]}) from error
        if found is None:
            raise ValidationError({"url": [f"No object is stored at {where.url}."]})
        return Response({"url": where.store.presigned_get(where.url.bucket, key, LINK_SECONDS), "size": found.size})
