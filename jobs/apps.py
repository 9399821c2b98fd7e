from django.apps import AppConfig
from django.urls import register_converter


class RowId:
    """A row's id in a URL: digits that fit the database's 64-bit integer (18 of them), so that a larger number
    is a 404 like any id that names nothing, never an overflow in the query (`<id:pk>` in the URL patterns)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Training jobs"

    def ready(self) -> None:
        register_converter(RowId, "id")
        # The models announce state changes; the stages above them listen (the models import none of them).
        from jobs import notifications
        from jobs.logs import progress
        from jobs.models import job_state_changed

        job_state_changed.connect(progress.publish_state_change, dispatch_uid="jobs.progress")
        job_state_changed.connect(notifications.notify_job_ended, dispatch_uid="jobs.notifications")
