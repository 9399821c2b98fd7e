"""The compare page: 2-10 runs the user may see, what differs, final metrics and durations side by side; the
overlaid charts read the same comparison from the API."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from jobs.pages.comparison import UnseenJobsError, comparison
from jobs.pages.run_diff import CompareIdsError, compare_ids

# The differences' sections (jobs.pages.comparison.run_facts), in the page's words.
SECTION_WORDS = {
    "parameters": _("Parameter"), "environment": _("Environment"), "engine": _("Engine"),
    "resources": _("Resources"), "code": _("Code"), "command": _("Command"), "placement": _("Ran on"),
    "nccl": "NCCL",
}


@login_required
def job_compare(request):
    every_rank = request.GET.get("rank") == "all"
    context: dict = {"every_rank": every_rank, "error": "", "ids_text": ",".join(request.GET.getlist("ids"))}
    try:
        ids = compare_ids(request.GET.getlist("ids"))
        context["comparison"] = comparison(request.user, ids, every_rank=every_rank)
    except CompareIdsError as error:
        context["error"] = str(error)
        return render(request, "jobs/job_compare.html", context, status=400)
    except UnseenJobsError as error:
        context["error"] = str(error)
        return render(request, "jobs/job_compare.html", context, status=404)
    ids_text = ",".join(str(job_id) for job_id in ids)
    context.update({
        "ids_text": ids_text,
        "data_url": f"{reverse('api-jobs-compare')}?ids={ids_text}&rank={'all' if every_rank else '0'}",
        "runs": context["comparison"]["runs"],
        "differences": [{**row, "section_words": SECTION_WORDS.get(row["section"], row["section"])}
                        for row in context["comparison"]["differences"]],
    })
    return render(request, "jobs/job_compare.html", context)
