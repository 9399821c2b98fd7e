"""Small display helpers for the job pages: state badges, durations, and the states' meaning for the scripts."""

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.translation import gettext as _

from jobs.launch.data_paths import object_url_of
from jobs.models import FINAL_STATES, STOPPABLE_STATES, JobStatus
from jobs.pages.card_words import card_words as say_card_words
from jobs.pages.display import PREPARATION_STEPS, badge, translated_message
from jobs.pages.display import spec_words as display_spec_words
from jobs.results.checkpoints import lost_work_words
from jobs.results.failure_card import plain_words
from jobs.results.rank_records import describe_outcome
from jobs.results.watchdog import hung_limit as job_hung_limit
from jobs.results.watchdog import rank_exit_grace as job_rank_exit_grace
from jobs.results.watchdog import watchdog_limit as job_watchdog_limit
from jobs.results.watchdog import watchdog_stops as job_watchdog_stops

register = template.Library()


@register.filter
def state_badge(status: str) -> str:
    return badge(status)


@register.filter
def rank_end(outcome) -> str:
    """How a rank ended, in words (a RankOutcome), for the per-rank table."""
    return describe_outcome(outcome)


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


@register.filter
def job_cause(job) -> dict | None:
    """Why a failed job failed, for the page's header: the failure card's headline, mpirun's own words when
    mpirun is what explains it, else the job's own message."""
    if job.status not in (JobStatus.FAILED, JobStatus.ABNORMAL):
        return None
    card = job.failure or {}
    title = say_card_words(card.get("title") or "") or translated_message(plain_words(job.status_message)) or _("The job failed")
    mpirun = ""
    if str(card.get("kind", "")).startswith("mpirun") or card.get("kind") in ("node_lost", "unknown"):
        mpirun = "\n".join((card.get("mpirun") or "").splitlines()[:4])
    exception = card.get("exception") or ""
    return {
        "title": title,
        "detail": exception if exception and exception not in title else "",
        "mpirun": mpirun,
        "has_card": bool(card),
    }


@register.filter
def watchdog_limit(job) -> int:
    """The silence the job's watchdog allows: the user's choice, else the administrator's default (0: off)."""
    return job_watchdog_limit(job.watchdog_seconds)


@register.filter
def hung_limit(job) -> int:
    """The silence the job's suspected hang was measured against, as it was then."""
    return job_hung_limit(job.silent_ranks, job.watchdog_seconds)


@register.filter
def watchdog_stops(job) -> bool:
    """Whether the watchdog stops the job once it suspects it hangs: the user's choice, else the administrator's."""
    return job_watchdog_stops(job.watchdog_action)


@register.filter
def rank_exit_grace(job) -> int | None:
    """Seconds the job may go on after a rank's failed end: the user's choice, else the setting (None: never)."""
    grace = job_rank_exit_grace(job.rank_exit_grace_seconds)
    return None if grace is None else int(grace)


@register.filter
def hung_hint(job) -> dict | None:
    """While a running job is suspected hung, what its state badge adds: how long its ranks have been silent, in a
    few words ("silent 12 min"), and which ranks past what limit, as the badge's title; None otherwise."""
    if job.status != JobStatus.RUNNING or not job.suspected_hung_since:
        return None
    since = [job.suspected_hung_since]
    for entry in job.silent_ranks or []:
        try:
            moment = datetime.fromisoformat(str(entry.get("silent_since", "")))
        except ValueError:
            continue
        if timezone.is_aware(moment):
            since.append(moment)
    minutes = max(int((timezone.now() - min(since)).total_seconds() // 60), 1)
    if minutes < 120:
        words = _("silent %(minutes)s min") % {"minutes": minutes}
    else:
        words = _("silent %(hours)s h") % {"hours": minutes // 60}
    ranks = ", ".join(str(entry.get("rank", "")) for entry in job.silent_ranks or [])
    title = _("Suspected hung: rank(s) %(ranks)s printed nothing for more than %(seconds)s s") % {
        "ranks": ranks, "seconds": job_watchdog_limit(job.watchdog_seconds)}
    return {"words": words, "title": title}


@register.filter
def event_message(text: str) -> str:
    """A timeline or state message in the page's language when it is one of the console's own, and any
    Python repr of an exception in it said in plain words."""
    return translated_message(plain_words(text))


@register.filter
def preparation_progress(state: str) -> dict:
    """How far a worker's preparation has gone, as a bar: allocated, preparing, uploading, ready."""
    return PREPARATION_STEPS.get(state, {"percent": 0, "tone": "muted"})


@register.filter
def iso_text(value: str) -> str:
    """An ISO time kept as text (in JSON fields) as the pages show times before the script formats them."""
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S") if timezone.is_aware(moment) else str(value)


@register.filter
def rank0_finals(job) -> dict:
    """Each metric's last value on rank 0 (or on the lines without a rank): what the chart's headline shows."""
    finals = {}
    for name in job.final_metrics or {}:
        points = job.metric_points.filter(name=name).order_by("-id").values_list("value", flat=True)
        point = points.filter(rank=0).first()
        if point is None:
            point = points.first()
        finals[name] = point if point is not None else job.final_metrics[name]
    return finals


@register.filter
def card_words(text: str) -> str:
    """A sentence of the failure card (headline, how a rank ended, a hint) in the page's language."""
    return say_card_words(str(text or ""))


@register.filter
def spec_words(spec) -> str:
    """A spec as ResourceSpec.display says it, in the page's language."""
    return display_spec_words(spec)


@register.filter
def lost_work(attempt) -> str:
    """'attempt 2 lost 3 min, 0.10 node-h (since its checkpoint at step 1,200)'."""
    return lost_work_words(attempt)


@register.filter
def keeps_checkpoints(job) -> bool:
    """Whether the job's program is given MA_CHECKPOINT_DIR: its train_url is in an object store."""
    return bool(object_url_of(job.parameter_pairs(), "train_url"))


@register.filter
def checkpoint_warnings(job) -> list:
    """The last few manifests the console did not trust (the timeline holds them all)."""
    return list(job.events.filter(kind="checkpoint-ignored").order_by("-id")[:3])


@register.filter
def rank_end_events(job) -> list:
    """What the run said of ranks that ended on their own while the others went on (the first few)."""
    return list(job.events.filter(kind="rank-ended").order_by("id")[:4])
