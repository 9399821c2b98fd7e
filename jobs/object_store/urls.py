"""The object-store URLs a job may name as data_url or train_url (`s3://bucket/prefix`, `obs://bucket/prefix`).

Pure: the launch plan, the form and the runtime read a URL the same way. A value without a scheme is not a
URL at all (a path in the container, as before); a value with one is either an object URL or refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.utils.translation import gettext as _

OBJECT_SCHEMES = ("s3", "obs")
# S3's rules for a bucket name, which OBS shares: 3-63 characters, lower case, digits, dots and hyphens.
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# A key's part a user may name: no control characters, and no "." or ".." segment (a key becomes a path).
BAD_SEGMENTS = {".", ".."}
# The most objects one input may hold: checked at submission, and again when the run lists them.
MAX_INPUT_OBJECTS = 20000


class ObjectUrlError(ValueError):
    """The text names a scheme but is not an object URL this console reads; the message says why."""


@dataclass(frozen=True)
class ObjectUrl:
    scheme: str
    bucket: str
    # The key prefix, without a leading "/"; "" for the whole bucket. A trailing "/" is kept as typed.
    prefix: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"

    @property
    def folder_prefix(self) -> str:
        """The prefix as a folder: what lies under it is the input or the output ("" or ending in "/")."""
        return self.prefix if not self.prefix or self.prefix.endswith("/") else self.prefix + "/"


def has_scheme(text: str) -> bool:
    return SCHEME.match(text.strip()) is not None


# S3's (and OBS's) longest key, in UTF-8 bytes.
MAX_KEY_BYTES = 1024


def safe_key_part(part: str) -> bool:
    """A relative key that can be a relative path: UTF-8, no control characters, no empty, "." or ".." segments,
    and short enough to be a key."""
    if not part or part.startswith("/") or any(ord(char) < 32 or 127 <= ord(char) < 160 for char in part):
        return False
    try:
        if len(part.encode("utf-8")) > MAX_KEY_BYTES - 64:  # room for the folder it goes under
            return False
    except UnicodeEncodeError:  # a file name that is not UTF-8 (its bytes kept as surrogates)
        return False
    return not any(segment in BAD_SEGMENTS or segment == "" for segment in part.split("/"))


def parse_object_url(text: str) -> ObjectUrl | None:
    """The object URL the text names; None when it names no scheme (a path); ObjectUrlError when it is bad."""
    match = SCHEME.match(text.strip())
    if match is None:
        return None
    scheme = match.group(1).lower()
    if scheme not in OBJECT_SCHEMES:
        raise ObjectUrlError(_("%(scheme)s:// is not a storage this console reads: use s3:// or obs://, or a path.")
                             % {"scheme": scheme})
    rest = text.strip()[match.end():]
    bucket, _slash, prefix = rest.partition("/")
    if not BUCKET.match(bucket) or ".." in bucket:
        raise ObjectUrlError(_("%(bucket)r is not a bucket name (3-63 lower-case letters, digits, dots and hyphens).")
                             % {"bucket": bucket})
    if prefix and not safe_key_part(prefix.rstrip("/")):
        raise ObjectUrlError(_("%(prefix)r is not a folder in the bucket (no empty, '.' or '..' parts, no control "
                               "characters).") % {"prefix": prefix})
    return ObjectUrl(scheme, bucket, prefix)
