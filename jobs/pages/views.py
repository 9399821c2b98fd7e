"""The pages: thin views over the same form, services and log store the API uses."""

import shutil
from functools import partial

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import transaction
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from console.database_busy import DATABASE_UNAVAILABLE, busy, busy_message
from console.security import policy_with_inline_styles
from jobs.images.availability import images_being_prepared
from jobs.launch.masking import mask_shell_text, masked
from jobs.models import (
    FINAL_STATES,
    CodeDirectory,
    Engine,
    EngineVersion,
    IllegalTransition,
    JobStatus,
    LauncherDefaults,
    ResourcePool,
    ResourceSpec,
    TrainingJob,
)
from jobs.pages.capacity import console_processes, pool_capacity
from jobs.pages.capacity_detail import pool_detail
from jobs.pages.display import display
from jobs.pages.job_list import WITHIN_CHOICES, filtered_jobs, list_filters, sort_links
from jobs.pages.log_download import timestamped_log_response
from jobs.pages.paging import IdsFirst
from jobs.pages.preview import preview
from jobs.pages.waiting_forecast import job_forecast
from jobs.results.outputs import outputs_root
from jobs.submission.access import DELETE_OTHERS, ensure_may, visible_code_dirs, visible_jobs
from jobs.submission.forms import MAX_ENV_VARS, PARAM_VALUE_MAX_CHARS, TrainingJobForm, page_data, with_kept_secrets
from jobs.submission.jobs import stop_visible_job, submit_job

JOBS_PER_PAGE = 20
COPY_SUFFIX = "-copy"


def _back(request, fallback: str):
    """Where an action returns to: the page it was started from, when that page is ours."""
    target = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return redirect(target)
    return redirect(fallback)


@login_required
def job_list(request):
    form, wanted = list_filters(request.GET)
    jobs = filtered_jobs(visible_jobs(request.user).select_related("engine_version__engine", "spec", "owner"),
                         wanted, request.user)
    page = Paginator(IdsFirst(jobs), JOBS_PER_PAGE).get_page(request.GET.get("page"))
    filters = request.GET.copy()
    filters.pop("page", None)
    unsorted = filters.copy()
    unsorted.pop("sort", None)
    context = {
        "page": page,
        "jobs": page.object_list,
        "form": form,
        "states": JobStatus.choices,
        "state": wanted.get("state") or "",
        "query": (wanted.get("q") or "").strip(),
        "mine": bool(wanted.get("mine")),
        "within": wanted.get("within") or "",
        "family": wanted.get("family"),
        "within_choices": WITHIN_CHOICES[1:],
        "sort": wanted["sort"],
        "sort_links": sort_links(wanted["sort"]),
        "metric_names": sorted({name for job in page.object_list for name in (job.final_metrics or {})})[:6],
        "filter_query": filters.urlencode(),
        "unsorted_query": unsorted.urlencode(),
        "any_unfinished": any(not job.is_final for job in page.object_list),
    }
    # The list's poller asks for the rows only.
    template = "jobs/_job_rows.html" if request.headers.get("HX-Request") else "jobs/job_list.html"
    return render(request, template, context)


@login_required
@require_POST
def job_bulk(request):
    """Stop or delete the jobs ticked on the list, each as its own button would, and say how it went."""
    action = request.POST.get("action")
    ids = [int(value) for value in request.POST.getlist("ids") if value.isdigit()][:JOBS_PER_PAGE * 5]
    done, refused = [], []
    # One transaction for all the ticked jobs: a database that cannot take it (console.database_busy) leaves every
    # one as it was, rather than some stopped and the rest not.
    with transaction.atomic():
        for job in visible_jobs(request.user).filter(pk__in=ids):
            try:
                if action == "stop":
                    stop_visible_job(request.user, job.pk)
                elif action == "delete":
                    ensure_may(request.user, job, DELETE_OTHERS)
                    # A failed job held for debugging still has containers and nodes: its hold ends first.
                    if not TrainingJob.objects.filter(pk=job.pk, status__in=FINAL_STATES,
                                                      held_until__isnull=True).delete()[0]:
                        raise IllegalTransition(job.status)
                    transaction.on_commit(partial(shutil.rmtree, outputs_root(job.pk), ignore_errors=True))
                else:
                    break
            except (PermissionDenied, IllegalTransition):
                refused.append(job.name)
            else:
                done.append(job.name)
    if done:
        words = _("Stop requested for: %(names)s.") if action == "stop" else _("Deleted: %(names)s.")
        messages.success(request, words % {"names": ", ".join(done)})
    if refused:
        words = (_("Not stopped (not running, or not yours to stop): %(names)s.") if action == "stop"
                 else _("Not deleted (still running, held for debugging, or not yours to delete): %(names)s."))
        messages.error(request, words % {"names": ", ".join(refused)})
    if not done and not refused:
        messages.error(request, _("Tick the jobs to act on first."))
    return _back(request, reverse("job-list"))


def _form_page(request, form, rebuilt_from=None):
    version = str(form["engine"].value() or "")
    family = EngineVersion.objects.filter(pk=version).values_list("engine_id", flat=True).first() if version.isdigit() else None
    return render(request, "jobs/job_form.html", {
        "form": form,
        # Only engines that have a version; a version whose image the console is still building is shown, not offered.
        "engines": Engine.objects.filter(versions__isnull=False).distinct().prefetch_related("versions"),
        "preparing_versions": images_being_prepared(),
        "selected_family": family,
        "max_env": MAX_ENV_VARS,
        "param_value_max": PARAM_VALUE_MAX_CHARS,
        "code_dirs": visible_code_dirs(request.user),
        "sharing_choices": CodeDirectory.Sharing.choices,
        "user_groups": request.user.groups.order_by("name"),
        "specs": ResourceSpec.objects.all(),
        "pools": ResourcePool.objects.all(),
        "rebuilt_from": rebuilt_from,
        # A Rebuild of the user's own job that saved a checkpoint may resume from it.
        "resumable_from": rebuilt_from.resume_checkpoint() if rebuilt_from and rebuilt_from.owner_id == request.user.pk
        else None,
        "grace_max": LauncherDefaults.current().checkpoint_grace_max_seconds,
    })


def _rebuild_source(request) -> TrainingJob | None:
    """The job a Rebuild started from, when it is the user's own: only then are its secrets carried over."""
    raw = request.POST.get("rebuild_of", "")
    if not raw.isdigit():
        return None
    return TrainingJob.objects.filter(pk=int(raw), owner=request.user).first()


@login_required
def job_create(request):
    if request.method == "POST":
        data = page_data(request.POST)
        source = _rebuild_source(request)
        if source:
            # The copy records where it came from: the list shows its family, the compare page the two side by side.
            data["rebuilt_from"] = source.pk
        form = TrainingJobForm(with_kept_secrets(data, source) if source else data, user=request.user)
        if form.is_valid():
            try:
                job = submit_job(form, request.user)
            except DATABASE_UNAVAILABLE:
                # The form again, as it was typed, saying why it was not submitted.
                messages.error(request, busy_message())
                return busy(_form_page(request, form))
            messages.success(request, _("Job %(name)s submitted.") % {"name": job.name})
            return redirect("job-detail", pk=job.pk)
    else:
        form = TrainingJobForm(user=request.user)
    return _form_page(request, form)


def copy_name(name: str, user) -> str:
    """A Rebuild's name: the old one with -copy (then -copy-2, ...), within the 64 characters names have."""
    taken = set(TrainingJob.objects.filter(owner=user, name__startswith=name[:50]).values_list("name", flat=True))
    for number in range(1, 100):
        suffix = COPY_SUFFIX if number == 1 else f"{COPY_SUFFIX}-{number}"
        candidate = name[:64 - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
    return name


@login_required
def job_rebuild(request, pk):
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    initial = TrainingJobForm.initial_from_job(job)
    initial["name"] = copy_name(job.name, request.user)
    if job.owner_id != request.user.pk:
        # Another's job (staff allowed to look) is a template only: its secret-looking values stay masked.
        initial["extra_args"] = mask_shell_text(initial["extra_args"])
        for key in ("data_url", "train_url"):
            initial[key] = masked(key, initial[key])
    return _form_page(request, TrainingJobForm(initial=initial, user=request.user), rebuilt_from=job)


@login_required
def job_name_taken(request):
    """Whether the user already has a job of this name: the form's hint, asked as the name is typed (names need
    not be unique, but the list tells jobs apart by them)."""
    name = request.GET.get("name", "").strip()[:64]
    return JsonResponse({"taken": bool(name) and TrainingJob.objects.filter(owner=request.user, name=name).exists()})


@login_required
@require_POST
def job_preview(request):
    return JsonResponse(preview(TrainingJobForm(page_data(request.POST), user=request.user)))


def _job_page_context(request, job) -> dict:
    return {
        "job": job,
        "shown": display(job),
        "workers": job.workers.all(),
        "events": job.events.all(),
        "next_url": reverse("job-detail", args=[job.pk]),
        "forecast": job_forecast(job),
    }


@login_required
def job_detail(request, pk):
    job = get_object_or_404(visible_jobs(request.user).select_related("pool"), pk=pk)
    response = render(request, "jobs/job_detail.html", _job_page_context(request, job))
    if job.owner_id == request.user.pk and settings.CONTENT_SECURITY_POLICY and job.may_have_containers:
        # The owner's page holds the job's terminal (see console.security.policy_with_inline_styles).
        response["Content-Security-Policy"] = policy_with_inline_styles(settings.CONTENT_SECURITY_POLICY)
    return response


@login_required
def job_live(request, pk):
    """The job page's live parts (header, state, timeline, workers, results; the command once it is built),
    for the page's one poller."""
    job = get_object_or_404(visible_jobs(request.user).select_related("pool"), pk=pk)
    context = _job_page_context(request, job)
    context["with_command"] = request.GET.get("command") == "0" and bool(job.command)
    return render(request, "jobs/_job_live.html", context)


@login_required
def job_log_download(request, pk):
    """The whole log (or one worker's) as text, each line after the time the console received it."""
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    return timestamped_log_response(request, job)


@login_required
@require_POST
def job_stop(request, pk):
    try:
        job = stop_visible_job(request.user, pk)
    except PermissionDenied as refusal:
        messages.error(request, str(refusal))
        return _back(request, reverse("job-detail", args=[pk]))
    except IllegalTransition:
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        messages.error(request, _("Job %(name)s is %(state)s and cannot be stopped.") % {
            "name": job.name, "state": job.get_status_display()})
    except DATABASE_UNAVAILABLE:
        # The job's page, its stop button still there, saying the stop was not recorded.
        messages.error(request, busy_message())
        return busy(job_detail(request, pk))
    else:
        messages.success(request, _("Stop requested for job %(name)s.") % {"name": job.name})
    return _back(request, reverse("job-detail", args=[pk]))


@login_required
@require_POST
def job_delete(request, pk):
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    try:
        ensure_may(request.user, job, DELETE_OTHERS)
    except PermissionDenied as refusal:
        messages.error(request, str(refusal))
        return redirect("job-detail", pk=pk)
    # Conditional on the state in the database, so a job that is still running is never deleted, nor one whose
    # containers and nodes are held for debugging (deleting it would free nodes its containers still use).
    deleted, _by_model = TrainingJob.objects.filter(pk=job.pk, status__in=FINAL_STATES,
                                                    held_until__isnull=True).delete()
    if not deleted and job.is_held_for_debugging:
        messages.error(request, _("Job %(name)s is held for debugging: release it first.") % {"name": job.name})
        return redirect("job-detail", pk=pk)
    if not deleted and job.held_until is not None:
        # Its hold is over and the console is removing its containers: nothing for the user to release.
        messages.error(request, _("Job %(name)s's hold for debugging has ended and its containers are being removed: "
                                  "delete it again in a few seconds.") % {"name": job.name})
        return redirect("job-detail", pk=pk)
    if not deleted:
        messages.error(request, _("Only finished jobs can be deleted; stop job %(name)s first.") % {"name": job.name})
        return redirect("job-detail", pk=pk)
    # The collected outputs live beside the database, not in it: they go with the job.
    shutil.rmtree(outputs_root(job.pk), ignore_errors=True)
    messages.success(request, _("Job %(name)s deleted.") % {"name": job.name})
    return redirect("job-list")


@login_required
def capacity(request):
    pools = pool_capacity()
    for pool in pools:
        if pool.slurm is None:
            pool.detail = pool_detail(request.user, pool.pool)
    return render(request, "jobs/capacity.html", {"pools": pools, **console_processes()})
