"""The job list's filters and order, as a form: what a reader may ask for, and a clear word for what it cannot be."""

import re
from datetime import timedelta

from django import forms
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, FloatField, Q, QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Now
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from jobs.models import JobStatus, TrainingJob
from jobs.results.metrics import NAME_RE as METRIC_NAME_RE

# The list's time filter: jobs created within the last ...
CREATED_WITHIN = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7), "30d": timedelta(days=30)}
WITHIN_CHOICES = [("", _("Any time")), ("1h", _("Last hour")), ("24h", _("Last 24 hours")), ("7d", _("Last 7 days")),
                  ("30d", _("Last 30 days"))]
# "#42" (or "42" alone) finds job 42 as well as the names that hold the text.
JOB_ID = re.compile(r"#?(\d{1,18})")
# The columns a reader may order by, and the fields behind each; a leading "-" reverses. A final metric is
# "metric:NAME". The id breaks ties, so a page never shows a job twice or skips one.
SORT_COLUMNS = {
    "name": ("name",),
    "state": ("status",),
    "engine": ("engine_version__engine__name", "engine_version__version"),
    "created": ("created_at",),
    "duration": ("list_duration",),
}
DEFAULT_SORT = "-created"
# A metric's name as its definition allows it (colons included).
# A family is walked at most this many generations up and down (a chain of Rebuilds of Rebuilds).
FAMILY_GENERATIONS = 50
METRIC_SORT = re.compile(r"-?metric:(" + METRIC_NAME_RE.pattern.removeprefix("^").removesuffix("$") + ")")


class JobListForm(forms.Form):
    state = forms.CharField(required=False)
    q = forms.CharField(required=False, max_length=200)
    within = forms.ChoiceField(choices=WITHIN_CHOICES, required=False)
    mine = forms.BooleanField(required=False)
    sort = forms.CharField(required=False, max_length=80)
    # A job's family: the job it was first rebuilt from, and every Rebuild of it and of them.
    family = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1)

    def clean_state(self) -> str:
        state = self.cleaned_data["state"]
        if state and state not in JobStatus.values:
            raise forms.ValidationError(
                _("There is no state %(state)s; the states are %(states)s.")
                % {"state": state[:40], "states": ", ".join(str(label) for label in JobStatus.labels)})
        return state

    def clean_sort(self) -> str:
        sort = self.cleaned_data["sort"] or DEFAULT_SORT
        if sort.lstrip("-") not in SORT_COLUMNS and not METRIC_SORT.fullmatch(sort):
            raise forms.ValidationError(
                _("The list cannot be ordered by %(sort)s: by name, state, engine, created, duration or "
                  "metric:NAME, with a leading - to reverse.") % {"sort": sort[:80]})
        return sort


def list_filters(data) -> tuple[JobListForm, dict]:
    """The form over the query string, and what it asks for: each field that is not valid is left out (and
    said on the page), the others still apply."""
    form = JobListForm(data)
    form.is_valid()
    wanted = {name: form.cleaned_data.get(name) for name in form.fields if name not in form.errors}
    wanted.setdefault("sort", DEFAULT_SORT)
    wanted["sort"] = wanted["sort"] or DEFAULT_SORT
    return form, wanted


def filtered_jobs(jobs: QuerySet[TrainingJob], wanted: dict, user) -> QuerySet[TrainingJob]:
    if wanted.get("state"):
        jobs = jobs.filter(status=wanted["state"])
    query = (wanted.get("q") or "").strip()
    if query:
        as_id = JOB_ID.fullmatch(query)
        jobs = jobs.filter(Q(name__icontains=query) | Q(pk=int(as_id.group(1)))) if as_id else jobs.filter(
            name__icontains=query)
    if wanted.get("mine"):
        jobs = jobs.filter(owner=user)
    if wanted.get("family"):
        jobs = jobs.filter(pk__in=family_ids(wanted["family"]))
    if wanted.get("within") in CREATED_WITHIN:
        jobs = jobs.filter(created_at__gte=timezone.now() - CREATED_WITHIN[wanted["within"]])
    return ordered(jobs, wanted["sort"])


def family_ids(job_id: int) -> set[int]:
    """The ids of a job's family: its root (the job its chain of Rebuilds started from) and all the root's
    Rebuilds, of any generation. Which of them a reader sees is the list's visible_jobs as always."""
    root = job_id
    for _generation in range(FAMILY_GENERATIONS):
        source = TrainingJob.objects.filter(pk=root).values_list("rebuilt_from_id", flat=True).first()
        if not source or source == job_id:
            break
        root = source
    family, generation = {root}, {root}
    for _generation in range(FAMILY_GENERATIONS):
        generation = set(TrainingJob.objects.filter(rebuilt_from_id__in=generation).values_list("pk", flat=True)) - family
        if not generation:
            break
        family |= generation
    return family


def ordered(jobs: QuerySet[TrainingJob], sort: str) -> QuerySet[TrainingJob]:
    descending = sort.startswith("-")
    key = sort.lstrip("-")
    metric = METRIC_SORT.fullmatch(sort)
    if metric:
        # The key as one key: a name holding "__" is not a path into nested objects.
        jobs = jobs.annotate(list_metric=Cast(KeyTextTransform(metric.group(1), "final_metrics"), FloatField()))
        fields: tuple[str, ...] = ("list_metric",)
    else:
        fields = SORT_COLUMNS[key]
    if key == "duration":
        # Running jobs count up to now; jobs that never started sort last either way.
        jobs = jobs.annotate(list_duration=ExpressionWrapper(
            Coalesce(F("ended_at"), Now(), output_field=DateTimeField()) - F("started_at"),
            output_field=DurationField()))
    if metric or key == "duration":
        # Jobs without the value (never started, no such metric) come last either way.
        order = [F(field).desc(nulls_last=True) if descending else F(field).asc(nulls_last=True) for field in fields]
        return jobs.order_by(*order, "-id" if descending else "id")
    # Plain names for the others: "-created_at", "-id" is the list's index (job_list_order) as it stands.
    return jobs.order_by(*(f"-{field}" if descending else field for field in fields), "-id" if descending else "id")


def sort_links(current: str) -> dict[str, dict[str, str]]:
    """Each sortable column's header: the sort its link asks for (the other direction when it is the current
    one), and how the list is ordered by it now (aria-sort's words, and an arrow)."""
    headers = {}
    for key in SORT_COLUMNS:
        if current == key:
            link, order, arrow = f"-{key}", "ascending", " ↑"
        elif current == f"-{key}":
            link, order, arrow = key, "descending", " ↓"
        else:
            # Newest and longest first; names, states and engines from A.
            link, order, arrow = (f"-{key}" if key in ("created", "duration") else key), "none", ""
        headers[key] = {"link": link, "order": order, "arrow": arrow}
    return headers
