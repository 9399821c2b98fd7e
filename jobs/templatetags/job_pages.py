"""Small display helpers for the job pages: state badges, durations, and the states' meaning for the scripts."""

from django import template

from jobs.job_display import badge
from jobs.models import FINAL_STATES, STOPPABLE_STATES, JobStatus

register = template.Library()


@register.filter
def state_badge(status: str) -> str:
    return badge(status)


@register.filter
def duration(seconds) -> str:
    """Seconds as H:MM:SS, the way the job list shows a run's length; blank for a job that never ran."""
    if seconds is None or seconds == "":
        return "–"
    total = max(int(float(seconds)), 0)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


@register.simple_tag
def job_states() -> dict:
    """Each state's label (in the page's language), badge, and whether it is final or stoppable."""
    return {
        state.value: {
            "label": str(state.label),
            "badge": badge(state.value),
            "final": state in FINAL_STATES,
            "stoppable": state in STOPPABLE_STATES,
        }
        for state in JobStatus
    }


@register.filter
def event_state(kind: str) -> str:
    """The state a timeline event entered ("state:Running" gives "Running"), or "" for another event."""
    return kind.removeprefix("state:") if kind.startswith("state:") else ""


@register.filter
def state_label(status: str) -> str:
    try:
        return str(JobStatus(status).label)
    except ValueError:
        return status
