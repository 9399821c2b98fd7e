from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Training jobs"

    def ready(self) -> None:
        # The models announce state changes; the stages above them listen (the models import none of them).
        from jobs import notifications
        from jobs.logs import progress
        from jobs.models import job_state_changed

        job_state_changed.connect(progress.publish_state_change, dispatch_uid="jobs.progress")
        job_state_changed.connect(notifications.notify_job_ended, dispatch_uid="jobs.notifications")
