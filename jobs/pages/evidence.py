"""A failed job's evidence bundles (download, JSON) and "release now" of its hold for debugging: its owner's
alone, anyone else gets 404."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from jobs.submission.access import visible_jobs
from jobs.submission.holds import bundle_filename, owned_bundle, release_hold


@login_required
@require_GET
def job_evidence(request, pk: int, bundle_id: int):
    bundle = owned_bundle(request.user, pk, bundle_id)
    response = JsonResponse(bundle.content, json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="{bundle_filename(bundle)}"'
    return response


@login_required
@require_POST
def job_release_hold(request, pk: int):
    if not visible_jobs(request.user).filter(pk=pk, owner=request.user).exists():
        raise Http404("No such job.")
    if release_hold(request.user, pk):
        messages.success(request, _("The hold ends now: the containers are being ended and the nodes freed."))
    else:
        messages.error(request, _("This job is not held for debugging."))
    return redirect("job-detail", pk=pk)
