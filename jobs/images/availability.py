"""Which engine versions' images are ready: a version naming a console-built image whose archive is not
there yet is "being prepared" (make run builds it); any other image is the admin's to make available."""

from pathlib import Path

from django.conf import settings

from jobs.images.recipes import REGISTRY_PREFIX, archive_name_of
from jobs.models import EngineVersion, Node


def being_prepared(reference: str) -> bool:
    return reference.startswith(REGISTRY_PREFIX + "/") and not (Path(settings.IMAGES_DIR) / archive_name_of(reference)).is_file()


def images_being_prepared() -> set[int]:
    return {pk for pk, image in EngineVersion.objects.values_list("pk", "image") if image and being_prepared(image)}


def nodes_holding(reference: str) -> list[str]:
    """The nodes whose last health check listed the image."""
    return [node.name for node in Node.objects.only("name", "health") if reference in (node.health.get("images") or [])]
