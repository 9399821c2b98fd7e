from . import checks  # noqa: F401 - registers the console's system checks
from .celery import app as celery_app

__all__ = ("celery_app",)
