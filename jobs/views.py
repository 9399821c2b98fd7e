"""The pages: thin views over the same form, services and log store the API uses."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render

from .access import visible_jobs
from .forms import TrainingJobForm
from .submission import submit_job


@login_required
def job_list(request):
    return render(request, "jobs/job_list.html", {"jobs": visible_jobs(request.user)[:200]})


@login_required
def job_create(request):
    form = TrainingJobForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        job = submit_job(form, request.user)
        return redirect("job-detail", pk=job.pk)
    return render(request, "jobs/job_form.html", {"form": form})


@login_required
def job_detail(request, pk):
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    return render(request, "jobs/job_detail.html", {"job": job, "workers": job.workers.all()})
