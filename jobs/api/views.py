"""The JSON API: thin views over the job form, the submission service and the log store."""

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils.http import content_disposition_header
from rest_framework import generics, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.access import may_share_code_dir, visible_code_dirs, visible_jobs
from jobs.code_dirs import ArchiveRejected, create_from_archive, name_refusal, upload_size_refusal
from jobs.forms import TrainingJobForm, form_errors
from jobs.logs.follow import job_log_events, line_payload, log_file_chunks
from jobs.logs.forms import LogQueryForm, LogReadForm
from jobs.logs.store import first_error, lines_after, read_after, read_before, render_line
from jobs.models import EngineVersion, IllegalTransition, ResourceSpec
from jobs.results.nccl_panel import nccl_report
from jobs.submission import stop_visible_job, submit_job

from .serializers import (
    CodeDirSerializer,
    CodeDirSharingSerializer,
    EngineSerializer,
    SpecSerializer,
    TrainingJobListSerializer,
    TrainingJobSerializer,
)

LOG_PAGE_LINES = 5000
LOG_JSON_PAGE_LINES = 2000
# What an upload's body may hold beside the archive (its other fields, the multipart framing).
UPLOAD_FIELDS_ALLOWANCE = 64 * 1024


class SpecList(generics.ListAPIView):
    queryset = ResourceSpec.objects.all()
    serializer_class = SpecSerializer


class EngineList(generics.ListAPIView):
    queryset = EngineVersion.objects.select_related("engine")
    serializer_class = EngineSerializer


class CodeDirList(APIView):
    """The code directories the user may see; POST uploads one (multipart: `name`, `archive`, and optionally
    `sharing` and `group`; private to the uploader unless said otherwise)."""

    parser_classes = [MultiPartParser]

    def get(self, request):
        return Response(CodeDirSerializer(visible_code_dirs(request.user), many=True).data)

    def post(self, request):
        limit = settings.CODE_DIR_MAX_UPLOAD_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit + UPLOAD_FIELDS_ALLOWANCE:
            # Refused before the body is parsed: the archive alone would be over the limit.
            return Response({"archive": [upload_size_refusal(declared, limit)]}, status=status.HTTP_400_BAD_REQUEST)
        name = (request.data.get("name") or "").strip()
        archive = request.FILES.get("archive")
        errors = {}
        name_problem = name_refusal(name)
        if name_problem:
            errors["name"] = [name_problem]
        sharing = CodeDirSharingSerializer(
            data={key: request.data[key] for key in ("sharing", "group") if request.data.get(key)},
            context={"user": request.user})
        if not sharing.is_valid():
            errors.update(sharing.errors)
        if archive is None:
            errors["archive"] = ["Attach a .zip or .tar.gz archive."]
        elif archive.size > limit:
            errors["archive"] = [upload_size_refusal(archive.size, limit)]
        if errors:
            return Response(errors, status=status.HTTP_400_BAD_REQUEST)
        try:
            code_dir = create_from_archive(name, archive, owner=request.user, sharing=sharing.validated_data["sharing"],
                                           shared_with=sharing.validated_data["shared_with"])
        except ArchiveRejected as refusal:
            return Response({refusal.field: [str(refusal)]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(CodeDirSerializer(code_dir).data, status=status.HTTP_201_CREATED)


class CodeDirDetail(APIView):
    """One code directory the user may see; PATCH (`sharing`, `group`) changes whom it is shared with: its owner only."""

    def get(self, request, pk):
        return Response(CodeDirSerializer(get_object_or_404(visible_code_dirs(request.user), pk=pk)).data)

    def patch(self, request, pk):
        code_dir = get_object_or_404(visible_code_dirs(request.user), pk=pk)
        if not may_share_code_dir(request.user, code_dir):
            raise PermissionDenied("Only the code directory's owner may change whom it is shared with.")
        unknown = sorted(set(request.data) - {"sharing", "group"})
        if unknown:
            return Response({key: ["Only sharing and group can be changed."] for key in unknown},
                            status=status.HTTP_400_BAD_REQUEST)
        sharing = CodeDirSharingSerializer(code_dir, data=request.data, partial=True, context={"user": request.user})
        sharing.is_valid(raise_exception=True)
        sharing.save()
        return Response(CodeDirSerializer(code_dir).data)


class TrainingJobList(APIView):
    def get(self, request):
        jobs = visible_jobs(request.user)
        if request.query_params.get("status"):
            jobs = jobs.filter(status=request.query_params["status"])
        if request.query_params.get("name"):
            jobs = jobs.filter(name__icontains=request.query_params["name"])
        return Response(TrainingJobListSerializer(jobs[:500], many=True).data)

    def post(self, request):
        data = dict(request.data)
        form = TrainingJobForm(data=data, user=request.user)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        job = submit_job(form, request.user)
        return Response(TrainingJobSerializer(job, context={"request": request}).data, status=status.HTTP_201_CREATED)


class TrainingJobDetail(generics.RetrieveAPIView):
    serializer_class = TrainingJobSerializer

    def get_queryset(self):
        return visible_jobs(self.request.user).prefetch_related("workers")


class TrainingJobLog(APIView):
    """Plain text after a cursor: `?offset=N` returns the lines numbered above N; X-Next-Offset says where to go on."""

    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        try:
            offset = max(int(request.query_params.get("offset", 0)), 0)
        except ValueError:
            return Response({"offset": ["Must be a whole number."]}, status=status.HTTP_400_BAD_REQUEST)
        lines = list(lines_after(job.pk, offset, LOG_PAGE_LINES))
        body = "".join(render_line(line) + "\n" for line in lines)
        response = HttpResponse(body, content_type="text/plain; charset=utf-8")
        response["X-Next-Offset"] = str(lines[-1].seq if lines else offset)
        response["X-Job-Status"] = job.status
        return response


class TrainingJobLogLines(APIView):
    """JSON lines of a job's log, filtered in the database: what the job page's log pane reads.

    Following: `after` is a sequence number and `next` in the answer is where to continue; a filtered
    read looks at a bounded stretch of the log, so `next` may move on with few or no lines, and `more`
    says to ask again at once. Filtering never moves the cursor backwards, so a follower sees each
    stored line at most once and misses none. Reading back: `tail` gives the latest lines, `before`
    older ones; `previous` is the `before` of the next older page (null at the start of the log).
    """

    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        form = LogReadForm(request.query_params)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        query = form.cleaned_data
        limit = query["limit"] or LOG_JSON_PAGE_LINES
        total = job.log_line_count
        if query["tail"] or query["before"]:
            page = read_before(job.pk, query["before"] or total + 1, query, limit, total=total)
            page.next = total if query["tail"] else None
        else:
            page = read_after(job.pk, query["after"] or 0, query, limit, total=total)
        return Response(
            {
                "lines": [line_payload(line) for line in page.lines],
                "next": page.next,
                "more": page.more,
                "previous": page.previous,
                "status": job.status,
                "total": total,
                "capped": job.log_lines_dropped > 0,
                "dropped": job.log_lines_dropped,
            }
        )


async def job_log(request, pk):
    """GET /api/v1/training-jobs/<id>/log: plain text after a cursor, or live events for Accept: text/event-stream."""
    if "text/event-stream" in request.headers.get("Accept", ""):
        return await job_log_events(request, pk)
    return await sync_to_async(TrainingJobLog.as_view())(request, pk=pk)


class TrainingJobLogDownload(APIView):
    """The whole log as one file, or one worker's (`?worker=N`) as the reference platform names it, streamed."""

    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        form = LogQueryForm(request.query_params)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        query = form.cleaned_data
        worker = query["worker"]
        name = f"{job.dns_name}-worker-{worker}.log" if worker is not None else f"{job.dns_name}.log"
        response = StreamingHttpResponse(log_file_chunks(request, job.pk, query, through=job.log_line_count),
                                         content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = content_disposition_header(True, name)
        return response


class TrainingJobLogFirstError(APIView):
    """The first line after `after` (0: from the start) that looks like an error, within the filters; null if none."""

    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        form = LogQueryForm(request.query_params)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        line = first_error(job.pk, form.cleaned_data, after=form.cleaned_data["after"] or 0)
        return Response({"seq": line.seq if line else None, "line": line_payload(line) if line else None})


class TrainingJobNccl(APIView):
    """What NCCL did in this job, read from its log, and what that means against the job's spec."""

    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        return Response(nccl_report(job))


class TrainingJobStop(APIView):
    def post(self, request, pk):
        try:
            job = stop_visible_job(request.user, pk)
        except IllegalTransition as error:
            return Response({"status": [str(error)]}, status=status.HTTP_409_CONFLICT)
        job.refresh_from_db()
        return Response(TrainingJobSerializer(job, context={"request": request}).data)
