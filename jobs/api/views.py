"""The JSON API: thin views over the job form, the submission service and the log store."""

import re

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db.models import Value
from django.db.models.functions import Concat
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils.http import content_disposition_header
from django.utils.translation import gettext
from django_filters.rest_framework import DjangoFilterBackend  # type: ignore[import-untyped]
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.api.log_events import job_log_events, log_file_chunks
from jobs.code_dirs.service import (
    ArchiveRejected,
    create_from_archive,
    name_refusal,
    refusal_words,
    upload_size_refusal,
)
from jobs.logs.follow import line_payload
from jobs.logs.forms import LogQueryForm, LogReadForm
from jobs.logs.search import search_before
from jobs.logs.store import first_error, lines_after, read_after, render_line
from jobs.models import EngineVersion, IllegalTransition, ResourceSpec, TrainingJob
from jobs.results.nccl_panel import nccl_report
from jobs.submission.access import may_share_code_dir, visible_code_dirs, visible_jobs
from jobs.submission.forms import TrainingJobForm, form_errors
from jobs.submission.jobs import stop_visible_job, submit_job_once

from .answers import FirstErrorSerializer, LogLinesSerializer, NcclReportSerializer
from .filters import JobFilter, JobOrdering
from .schema import AFTER, LOG_FILTERS, ApiError
from .serializers import (
    CodeDirSerializer,
    CodeDirSharingSerializer,
    CodeDirUploadSerializer,
    EngineSerializer,
    SpecSerializer,
    TrainingJobListSerializer,
    TrainingJobSerializer,
)

IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_RE = re.compile(r"[\x21-\x7e]{1,128}")
LOG_PAGE_LINES = 5000
LOG_JSON_PAGE_LINES = 2000
# What an upload's body may hold beside the archive (its other fields, the multipart framing).
UPLOAD_FIELDS_ALLOWANCE = 64 * 1024


@extend_schema(summary="The specs (flavors) a job may run on")
class SpecList(generics.ListAPIView):
    queryset = ResourceSpec.objects.all()
    serializer_class = SpecSerializer


@extend_schema(summary="The engine versions a job may run with")
class EngineList(generics.ListAPIView):
    queryset = EngineVersion.objects.select_related("engine")
    serializer_class = EngineSerializer


class CodeDirList(APIView):
    """The code directories the user may see; POST uploads one (multipart: `name`, `archive`, and optionally
    `sharing` and `group`; private to the uploader unless said otherwise)."""

    parser_classes = [MultiPartParser]

    @extend_schema(summary="The code directories the user may see", responses=CodeDirSerializer(many=True))
    def get(self, request):
        return Response(CodeDirSerializer(visible_code_dirs(request.user), many=True).data)

    @extend_schema(summary="Upload a code directory", request={"multipart/form-data": CodeDirUploadSerializer},
                   responses={201: CodeDirSerializer})
    def post(self, request):
        limit = settings.CODE_DIR_MAX_UPLOAD_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit + UPLOAD_FIELDS_ALLOWANCE:
            # Refused before the body is parsed: the archive alone would be over the limit.
            return Response({"archive": [refusal_words(upload_size_refusal(declared, limit))]},
                            status=status.HTTP_400_BAD_REQUEST)
        name = (request.data.get("name") or "").strip()
        archive = request.FILES.get("archive")
        errors = {}
        name_problem = name_refusal(name, request.user)
        if name_problem:
            errors["name"] = [name_problem]
        sharing = CodeDirSharingSerializer(
            data={key: request.data[key] for key in ("sharing", "group") if request.data.get(key)},
            context={"user": request.user})
        if not sharing.is_valid():
            errors.update(sharing.errors)
        if archive is None:
            errors["archive"] = [gettext("Attach a .zip or .tar.gz archive.")]
        elif archive.size > limit:
            errors["archive"] = [refusal_words(upload_size_refusal(archive.size, limit))]
        if errors:
            return Response(errors, status=status.HTTP_400_BAD_REQUEST)
        try:
            code_dir = create_from_archive(name, archive, owner=request.user, sharing=sharing.validated_data["sharing"],
                                           shared_with=sharing.validated_data["shared_with"])
        except ArchiveRejected as refusal:
            return Response({refusal.field: [refusal_words(refusal)]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(CodeDirSerializer(code_dir).data, status=status.HTTP_201_CREATED)


class CodeDirDetail(APIView):
    """One code directory the user may see; PATCH (`sharing`, `group`) changes whom it is shared with: its owner only."""

    @extend_schema(summary="One code directory", responses=CodeDirSerializer)
    def get(self, request, pk):
        return Response(CodeDirSerializer(get_object_or_404(visible_code_dirs(request.user), pk=pk)).data)

    @extend_schema(summary="Change whom a code directory is shared with", request=CodeDirSharingSerializer,
                   responses=CodeDirSerializer)
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


def submission_form_data(body: dict) -> tuple[dict, dict[str, list[str]]]:
    """A submission as the job form takes it, and what is wrong with `engine_version` (checked here, reported
    with the form's own errors): `engine` and `engine_version` (the names the engine list and a job's detail
    give) become the engine version they name. `engine` alone keeps meaning what the form accepts (an id, a
    version, or an engine's name for its latest version), and so does the combined "MPI <version>" an engine
    version is shown as."""
    data = dict(body)
    version = data.pop("engine_version", None)
    engine = data.get("engine")
    versions = EngineVersion.objects.select_related("engine")
    if version not in (None, ""):
        if not isinstance(engine, str) or not isinstance(version, str):
            return data, {"engine_version": ["Give the engine's name as `engine` and its version as text."]}
        found = versions.filter(engine__name=engine.strip(), version=version.strip()).first()
        if found is None:
            return data, {"engine_version": [f"{engine} has no version {version!r}; /api/v1/engines lists them."]}
        data["engine"] = found.pk
    elif isinstance(engine, str) and " " in engine.strip():
        found = versions.annotate(label=Concat("engine__name", Value(" "), "version")).filter(label=engine.strip()).first()
        if found is not None:
            data["engine"] = found.pk
    return data, {}


@extend_schema(summary="The jobs the user may see, newest first")
class TrainingJobList(generics.ListAPIView):
    """The jobs the user may see (their own; everyone's with the permission), paginated, filtered and ordered.

    POST submits a job: the body is a job's detail without its read-only fields.
    """

    serializer_class = TrainingJobListSerializer
    filter_backends = [DjangoFilterBackend, JobOrdering]
    filterset_class = JobFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema's generator, with no user
            return TrainingJob.objects.none()
        return visible_jobs(self.request.user)

    @extend_schema(
        summary="Submit a job", request=TrainingJobSerializer,
        parameters=[OpenApiParameter(
            IDEMPOTENCY_HEADER, str, OpenApiParameter.HEADER, required=False,
            description="Any string of up to 128 printable characters. A retry with the same key (after a lost "
                        "answer) returns the job the first submission created, with 200 instead of 201.")],
        responses={201: TrainingJobSerializer, 200: TrainingJobSerializer})
    def post(self, request):
        key = request.headers.get(IDEMPOTENCY_HEADER, "")
        if key and not IDEMPOTENCY_KEY_RE.fullmatch(key):
            return Response({IDEMPOTENCY_HEADER: ["At most 128 printable ASCII characters."]},
                            status=status.HTTP_400_BAD_REQUEST)
        data, errors = submission_form_data(request.data)
        form = TrainingJobForm(data=data, user=request.user)
        # Every bad field at once: the form's, and engine_version's beside them.
        if not form.is_valid() or errors:
            return Response({**form_errors(form), **errors}, status=status.HTTP_400_BAD_REQUEST)
        job, created = submit_job_once(form, request.user, key)
        return Response(TrainingJobSerializer(job, context={"request": request}).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                        headers={} if created else {"Idempotent-Replayed": "true"})


@extend_schema(summary="One job: its submission and what became of it")
class TrainingJobDetail(generics.RetrieveAPIView):
    serializer_class = TrainingJobSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return TrainingJob.objects.none()
        return visible_jobs(self.request.user).prefetch_related("workers", "checkpoints", "attempts")


class TrainingJobLog(APIView):
    """Plain text after a cursor: `?offset=N` returns the lines numbered above N; X-Next-Offset says where to go on."""

    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        try:
            offset = max(int(request.query_params.get("offset", 0)), 0)
        except ValueError:
            return Response({"offset": ["Must be a whole number."]}, status=status.HTTP_400_BAD_REQUEST)
        lines = lines_after(job.pk, offset, LOG_PAGE_LINES)
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
    older ones; `previous` is the `before` of the next older page (null at the start of the log). A
    filtered read back searches the whole log for up to a second: fewer lines than asked for with a
    `previous` mean the lines before `previous` are not searched yet, not that none matches.
    """

    @extend_schema(summary="A job's log lines as JSON, filtered", responses=LogLinesSerializer, parameters=[
        AFTER, *LOG_FILTERS,
        OpenApiParameter("before", int, description="A sequence number: the lines before it (reading back)."),
        OpenApiParameter("tail", bool, description="The latest lines."),
    ])
    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        form = LogReadForm(request.query_params)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        query = form.cleaned_data
        limit = query["limit"] or LOG_JSON_PAGE_LINES
        total = job.log_line_count
        if query["tail"] or query["before"]:
            page = search_before(job.pk, query["before"] or total + 1, query, limit, total=total)
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

    @extend_schema(summary="Download a job's log", parameters=LOG_FILTERS, responses={
        (200, "text/plain"): OpenApiResponse(response={"type": "string"}, description="The log, as a file.")})
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

    @extend_schema(summary="The first error-looking line of a job's log", parameters=[AFTER, *LOG_FILTERS],
                   responses=FirstErrorSerializer)
    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        form = LogQueryForm(request.query_params)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        line = first_error(job.pk, form.cleaned_data, after=form.cleaned_data["after"] or 0)
        return Response({"seq": line.seq if line else None, "line": line_payload(line) if line else None})


class TrainingJobNccl(APIView):
    """What NCCL did in this job, read from its log, and what that means against the job's spec."""

    @extend_schema(summary="What NCCL did in a job", responses=NcclReportSerializer)
    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        return Response(nccl_report(job))


class TrainingJobStop(APIView):
    """Stop a job: a queued one ends at once (Terminated), a live one goes Terminating while its containers end."""

    @extend_schema(summary="Stop a job", request=None, responses={200: TrainingJobSerializer, 409: ApiError})
    def post(self, request, pk):
        try:
            job = stop_visible_job(request.user, pk)
        except IllegalTransition as error:
            return Response({"status": [str(error)]}, status=status.HTTP_409_CONFLICT)
        job.refresh_from_db()
        return Response(TrainingJobSerializer(job, context={"request": request}).data)
