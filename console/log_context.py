"""Puts the running Celery task's id on every log record, so a job's lines can be found across processes."""

import logging

from celery import current_task


class TaskIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # current_task proxies the task this thread runs: falsy outside one, and passing attributes through.
        request = getattr(current_task, "request", None) if current_task else None
        record.task_id = getattr(request, "id", None) or "-"
        return True


class MaskSecretsFilter(logging.Filter):
    """Masks secret-looking values in every log record (asyncssh logs each command it runs, mpirun's included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from jobs.launch.masking import mask_shell_text  # settings load this module before the apps are ready

        message = record.getMessage()
        shown = mask_shell_text(message)
        if shown != message:
            record.msg, record.args = shown, None
        return True
