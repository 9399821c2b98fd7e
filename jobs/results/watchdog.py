"""What a job chose for the watchdog and for a rank's end, or the default, read when it is needed.

A job keeps only what its user chose (None: nothing chosen), so that a Rebuild copies a choice and never the
default of the day; the default (the administrator's launcher defaults, or the RANK_EXIT_GRACE_SECONDS setting)
is read when the choice is needed, by the run and the monitor that watch the job and by the pages and the API
that say it.
"""

from django.conf import settings

from jobs.models import RANK_EXIT_NEVER, LauncherDefaults, WatchdogAction


def watchdog_limit(chosen: int | None, defaults: LauncherDefaults | None = None) -> int:
    """Seconds a rank may print nothing before its job is suspected hung (0: no watchdog)."""
    if chosen is not None:
        return chosen
    return (defaults or LauncherDefaults.current()).watchdog_seconds


def hung_limit(silent_ranks: list[dict[str, object]], chosen: int | None) -> int:
    """The silence a suspected hang was measured against: the limit in force when the watchdog marked it (kept
    with its ranks), not today's default; jobs marked before that was kept fall back to the limit of now."""
    recorded = silent_ranks[0].get("limit_seconds") if silent_ranks else None
    return recorded if isinstance(recorded, int) else watchdog_limit(chosen)


def watchdog_stops(chosen: str | None, defaults: LauncherDefaults | None = None) -> bool:
    """Whether the watchdog stops a job it suspects hangs (else it only marks it and says so)."""
    if chosen:
        return chosen == WatchdogAction.STOP
    return (defaults or LauncherDefaults.current()).watchdog_may_stop


def rank_exit_grace(chosen: int | None) -> float | None:
    """Seconds a job may go on after a rank ended not as 0 while the others wait, before it fails (0: at once);
    None: never. The setting's 0 means never, as it always has; a job says never with RANK_EXIT_NEVER."""
    if chosen is None:
        return float(settings.RANK_EXIT_GRACE_SECONDS) or None
    return None if chosen == RANK_EXIT_NEVER else float(chosen)
