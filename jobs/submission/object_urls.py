"""The checks an object-store data_url or train_url gets at submission, so a job that could not read its input
or keep its output is refused where the user typed the URL, before it takes any node."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.utils.translation import gettext as _

from jobs.launch.data_paths import is_input
from jobs.logs.store import readable_size
from jobs.models import ResourcePool, Storage
from jobs.object_store.client import StoreError
from jobs.object_store.urls import MAX_INPUT_OBJECTS, ObjectUrlError, parse_object_url


@dataclass(frozen=True)
class InputRoom:
    """The most an input may take on each node a job may run on: the smallest work disk of the job's node count
    best nodes (by their health checks' facts), less what a node keeps for itself (NODE_DISK_RESERVE_GB).
    Its size, not what is free: a node's cache may already hold the input, and the node checks free space
    itself before the first byte."""

    bytes: int
    reserve_bytes: int


def input_room(nodes_health: Iterable[object], node_count: int) -> InputRoom | None:
    """The room of the best `node_count` nodes whose checks reported their disk; None when fewer did."""
    sizes = sorted((health["disk_total_bytes"] for health in nodes_health
                    if isinstance(health, dict) and isinstance(health.get("disk_total_bytes"), int)), reverse=True)
    if node_count < 1 or len(sizes) < node_count:
        return None
    reserve = settings.NODE_DISK_RESERVE_GB * 1024**3
    return InputRoom(max(sizes[node_count - 1] - reserve, 0), reserve)


@dataclass
class InputsListed:
    """What each input holds, as its check listed it: their total is held against the nodes' room once each one
    alone fits (every input is fetched onto every node)."""

    bytes_by_name: dict[str, int] = field(default_factory=dict)

    def too_many_for(self, room: InputRoom | None) -> str:
        """Why the inputs together cannot be fetched ("" when they fit, room is not known, or there is one)."""
        total = sum(self.bytes_by_name.values())
        if room is None or len(self.bytes_by_name) < 2 or total <= room.bytes:
            return ""
        return _("The inputs %(names)s hold %(size)s together: more than the nodes this job may run on can hold "
                 "(%(room)s each, keeping %(reserve)s for the node itself).") % {
                     "names": ", ".join(sorted(self.bytes_by_name)), "size": readable_size(total),
                     "room": readable_size(room.bytes), "reserve": readable_size(room.reserve_bytes)}


def object_url_problem(name: str, text: str, user_id: int | None, username: str, pool: ResourcePool | None,
                       input_room: InputRoom | None = None, listed: InputsListed | None = None) -> str:
    """Why `text`, typed as an input (data_url, data_url_1 ...) or train_url, cannot be used ("" when it can, or when it is a path).
    `input_room`: what the nodes the job may run on can hold of an input (None: not known); `listed`: where an
    input's size is kept."""
    try:
        url = parse_object_url(text)
        if url is None:
            return ""
        if user_id is None:
            return _("Sign in to use an object store.")
        where = Storage.reach_for(text, pool.pk if pool else None, user_id, username)
        if is_input(name):
            if not where.store.bucket_exists(url.bucket):
                return _("Bucket %(bucket)s does not exist yet: put your data in it first.") % {
                    "bucket": url.bucket}
            # Every object, as the run will fetch them (StoreError past MAX_INPUT_OBJECTS, said as a limit).
            size = sum(item.size for item in where.store.objects(url.bucket, url.folder_prefix, MAX_INPUT_OBJECTS))
            if not size and not where.store.has_any(url.bucket, url.folder_prefix):
                return _("Nothing is stored under %(url)s.") % {"url": text}
            if listed is not None:
                listed.bytes_by_name[name] = size
            if input_room is not None and size > input_room.bytes:
                return _("%(url)s holds %(size)s: more than the nodes this job may run on can hold (%(room)s each, "
                         "keeping %(reserve)s for the node itself).") % {
                    "url": text, "size": readable_size(size), "room": readable_size(input_room.bytes),
                    "reserve": readable_size(input_room.reserve_bytes)}
        else:
            # The user's own bucket is made on first use, as the platform's output buckets are the user's.
            where.store.create_bucket(url.bucket)
    except (ObjectUrlError, StoreError) as error:
        return str(error)
    return ""
