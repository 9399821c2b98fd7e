"""The hung-rank watchdog's time for a job.

A job keeps only what its user chose (None: nothing chosen), so that a Rebuild copies a choice and never the
default of the day; the administrator's default is read when the time is needed, by the monitor that watches
the job and by the pages and the API that say it.
"""

from jobs.models import LauncherDefaults


def watchdog_limit(chosen: int | None, defaults: LauncherDefaults | None = None) -> int:
    """Seconds a rank may print nothing before its job is suspected hung (0: no watchdog)."""
    if chosen is not None:
        return chosen
    return (defaults or LauncherDefaults.current()).watchdog_seconds
