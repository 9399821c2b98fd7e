"""The JSON API: thin views over the job form, the submission service and the log store."""

import tempfile
from pathlib import Path

from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from rest_framework import generics, status
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from ..access import visible_jobs
from ..code_dirs import ArchiveRejected, create_from_archive
from ..forms import LogQueryForm, TrainingJobForm
from ..log_store import line_matches, lines_after, render_line
from ..models import CodeDirectory, EngineVersion, IllegalTransition, ResourceSpec
from ..submission import request_stop, submit_job
from .serializers import (
    CodeDirSerializer,
    EngineSerializer,
    SpecSerializer,
    TrainingJobListSerializer,
    TrainingJobSerializer,
)

LOG_PAGE_LINES = 5000
LOG_JSON_PAGE_LINES = 2000


def form_errors(form) -> dict[str, list[str]]:
    return {field: [error["message"] for error in errors] for field, errors in form.errors.get_json_data().items()}


class SpecList(generics.ListAPIView):
    queryset = ResourceSpec.objects.all()
    serializer_class = SpecSerializer


class EngineList(generics.ListAPIView):
    queryset = EngineVersion.objects.select_related("engine")
    serializer_class = EngineSerializer


class CodeDirList(APIView):
    parser_classes = [MultiPartParser]

    def get(self, request):
        return Response(CodeDirSerializer(CodeDirectory.objects.all(), many=True).data)

    def post(self, request):
        name = (request.data.get("name") or "").strip()
        archive = request.FILES.get("archive")
        errors = {}
        if not name or not all(c.isalnum() or c in "-_" for c in name) or len(name) > 64:
            errors["name"] = ["Use 1 to 64 letters, digits, '-' or '_'."]
        if archive is None:
            errors["archive"] = ["Attach a .zip or .tar.gz archive."]
        if errors:
            return Response(errors, status=status.HTTP_400_BAD_REQUEST)
        with tempfile.NamedTemporaryFile(suffix=Path(archive.name).suffix) as saved:
            for chunk in archive.chunks():
                saved.write(chunk)
            saved.flush()
            try:
                code_dir = create_from_archive(name, Path(saved.name), owner=request.user)
            except ArchiveRejected as error:
                return Response({"archive": [str(error)]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(CodeDirSerializer(code_dir).data, status=status.HTTP_201_CREATED)


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
        form = TrainingJobForm(data=data)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        job = submit_job(form, request.user)
        return Response(TrainingJobSerializer(job).data, status=status.HTTP_201_CREATED)


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
    """JSON lines after a cursor, optionally filtered: what the job page's log pane polls.

    `after` is a sequence number; `next` in the answer is where to continue. Filtering never moves
    the cursor backwards, so a follower sees each stored line at most once and misses none.
    """

    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        form = LogQueryForm(request.query_params)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        query = form.cleaned_data
        scanned = list(lines_after(job.pk, query["after"] or 0, query["limit"] or LOG_JSON_PAGE_LINES))
        lines = [line for line in scanned if line_matches(line, query)]
        return Response(
            {
                "lines": [
                    {"seq": line.seq, "worker": line.worker_index, "rank": line.rank, "stream": line.stream,
                     "text": line.text, "at": line.at}
                    for line in lines
                ],
                "next": scanned[-1].seq if scanned else (query["after"] or 0),
                "status": job.status,
                "total": job.log_line_count,
            }
        )


class TrainingJobStop(APIView):
    def post(self, request, pk):
        with transaction.atomic():
            job = get_object_or_404(visible_jobs(request.user), pk=pk)
            try:
                request_stop(job)
            except IllegalTransition as error:
                return Response({"status": [str(error)]}, status=status.HTTP_409_CONFLICT)
        job.refresh_from_db()
        return Response(TrainingJobSerializer(job).data)
