"""The job page's log download: the reference platform's file layout, each line after the time the console
received it (UTC, ISO 8601), so a download can be lined up with the page and with other logs.

The API's download (/log/download) keeps the bare file; this one is what the page's button gives.
"""

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header

from jobs.logs.forms import LogQueryForm
from jobs.logs.matching import line_filter
from jobs.logs.store import DOWNLOAD_CHUNK_LINES, render_text
from jobs.models import LogLine, TrainingJob


def _chunk(job_id: int, query: dict, after: int, through: int) -> tuple[str, int | None]:
    rows = list(LogLine.objects.filter(job_id=job_id, seq__gt=after, seq__lte=through).filter(line_filter(query))
                .order_by("seq").values_list("seq", "at", "stream", "rank", "text")[:DOWNLOAD_CHUNK_LINES])
    if not rows:
        return "", None
    text = "".join(f"{at.isoformat(timespec='milliseconds')} {render_text(stream, rank, line)}\n"
                   for _seq, at, stream, rank, line in rows)
    return text, rows[-1][0]


def _sync_chunks(job_id: int, query: dict, through: int):
    after: int | None = 0
    while after is not None:
        text, after = _chunk(job_id, query, after, through)
        if text:
            yield text.encode("utf-8")


async def _async_chunks(job_id: int, query: dict, through: int):
    after: int | None = 0
    while after is not None:
        text, after = await sync_to_async(_chunk)(job_id, query, after, through)
        if text:
            yield text.encode("utf-8")


def timestamped_log_response(request, job: TrainingJob) -> HttpResponse | StreamingHttpResponse:
    form = LogQueryForm({"worker": request.GET.get("worker", "")})
    if not form.is_valid():
        return HttpResponse("worker must be a worker's number.\n", status=400, content_type="text/plain; charset=utf-8")
    query = form.cleaned_data
    worker = query["worker"]
    name = f"{job.dns_name}-worker-{worker}.log" if worker is not None else f"{job.dns_name}.log"
    # Django buffers an iterator of the other kind whole before sending it: the kind follows the server.
    under_asgi = isinstance(request, ASGIRequest)
    chunks = (_async_chunks if under_asgi else _sync_chunks)(job.pk, query, job.log_line_count)
    response = StreamingHttpResponse(chunks, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = content_disposition_header(True, name)
    return response
