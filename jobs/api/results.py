"""What a job's run left: each rank's end and the "why it failed" card, its metrics, its outputs.

Thin views over the records jobs.results and jobs.runtime.monitor keep.
"""

import tempfile
from datetime import datetime
from pathlib import PurePosixPath
from typing import NamedTuple

from django.db.models import Count
from django.http import FileResponse, Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.models import Storage
from jobs.object_store.client import StoreError
from jobs.object_store.urls import ObjectUrlError, parse_object_url, safe_key_part
from jobs.results.metric_series import thinned_series
from jobs.results.metrics import default_metric_definitions
from jobs.results.outputs import in_store, stored_file, write_archive
from jobs.results.rank_records import describe_outcome, signal_name
from jobs.results.watchdog import hung_limit
from jobs.submission.access import visible_jobs

from .answers import MetricsSerializer, OutcomeSerializer, OutputsSerializer
from .schema import binary
from .serializers import CheckpointSerializer

METRIC_POINTS_PAGE = 5000
# How long a link to an output file in its bucket is good for.
DOWNLOAD_LINK_SECONDS = 300
# A chart's first read may ask for its series downsampled to at most this many points each.
METRIC_MAX_POINTS_LIMIT = 20000


def _job(request, pk):
    return get_object_or_404(visible_jobs(request.user), pk=pk)


def outcome_data(job) -> dict:
    """The job's end as the API and the results panel show it."""
    ranks = [
        {
            "rank": outcome.rank,
            "worker": outcome.worker_index,
            "node": outcome.node_name,
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "signal_name": signal_name(outcome.signal) if outcome.signal else "",
            "stop_signal": outcome.stop_signal,
            "ended_at": outcome.ended_at,
            "how": describe_outcome(outcome),
        }
        for outcome in job.rank_outcomes.all()
    ]
    hung = None
    if job.suspected_hung_since:
        hung = {"since": job.suspected_hung_since, "watchdog_seconds": hung_limit(job.silent_ranks, job.watchdog_seconds),
                "ranks": job.silent_ranks}
    return {
        "id": job.pk,
        "status": job.status,
        "exit_code": job.exit_code,
        "status_message": job.status_message,
        "stop_reason": job.stop_reason,
        "suspected_hung": hung,
        "ranks": ranks,
        "failure": job.failure or None,
        "cleanup": job.cleanup_report or None,
    }


class JobOutcome(APIView):
    @extend_schema(summary="How a job ended: each rank's end and the failure card", responses=OutcomeSerializer)
    def get(self, request, pk):
        return Response(outcome_data(_job(request, pk)))


class JobMetrics(APIView):
    """The job's metric points after `after` (a point id; 0 for all), with each metric's count and last value."""

    @extend_schema(summary="A job's metrics", responses=MetricsSerializer, parameters=[
        OpenApiParameter("after", int, description="A point id: the points after it (0: all)."),
        OpenApiParameter("max_points", int, description="With after=0: each series downsampled to about this many "
                                                         "points (its first, last, and each stretch's lowest and highest); 0 or from 4.")])
    def get(self, request, pk):
        job = _job(request, pk)
        try:
            after = max(int(request.query_params.get("after", 0)), 0)
        except ValueError:
            return Response({"after": ["Must be a whole number."]}, status=status.HTTP_400_BAD_REQUEST)
        try:
            max_points = int(request.query_params.get("max_points", 0))
        except ValueError:
            return Response({"max_points": ["Must be a whole number."]}, status=status.HTTP_400_BAD_REQUEST)
        if max_points and not 4 <= max_points <= METRIC_MAX_POINTS_LIMIT:
            # 1 to 3 leave no room between a series' ends: it would come back whole.
            return Response({"max_points": [f"Must be 0 (no downsampling, paged) or from 4 to {METRIC_MAX_POINTS_LIMIT}."]},
                            status=status.HTTP_400_BAD_REQUEST)
        definitions = job.metric_definitions or default_metric_definitions()
        counts = dict(job.metric_points.values("name").annotate(count=Count("id")).values_list("name", "count"))
        downsampled: set[str] = set()
        if max_points and not after:
            # The first read of a chart: every series at most about max_points long, in one answer.
            points, downsampled = _downsampled_points(job, max_points)
        else:
            points = list(job.metric_points.filter(id__gt=after).order_by("id")[:METRIC_POINTS_PAGE])
        metrics = []
        for definition in definitions:
            name = definition["name"]
            count = counts.get(name, 0)
            last = job.metric_points.filter(name=name).order_by("-id").values("value", "step", "at").first()
            note = ""
            if not count:
                note = ("No log line matched this metric." if job.is_final
                        else "No log line has matched this metric yet.")
            metrics.append({"name": name, "regex": definition["regex"], "count": count, "last": last,
                            "matched": bool(count), "note": note, "downsampled": name in downsampled})
        return Response(
            {
                "status": job.status,
                "final": job.is_final,
                "metrics": metrics,
                "points": [
                    {"id": point.id, "name": point.name, "rank": point.rank, "step": point.step,
                     "value": point.value, "at": point.at}
                    for point in points
                ],
                "next": max((point.id for point in points), default=after),
                "more": not max_points and len(points) == METRIC_POINTS_PAGE,
            }
        )


class SeriesPoint(NamedTuple):
    id: int
    name: str
    rank: int | None
    step: int | None
    value: float
    at: datetime


def _downsampled_points(job, max_points: int) -> tuple[list, set[str]]:
    """Every series of the job at most about max_points long, in id order, and the metrics that were cut."""
    # Plain rows, not model instances: a long run has millions of points (jobs.results.metric_series).
    series = thinned_series(job.metric_points.all(), ("id", "step", "value", "at"), max_points,
                            make=lambda row: SeriesPoint(row[2], row[0], row[1], *row[3:]),
                            value=lambda point: point.value)
    kept = sorted((point for shown, _length in series.values() for point in shown), key=lambda point: point.id)
    return kept, {name for (name, _rank), (shown, length) in series.items() if len(shown) < length}


def stored_object_url(job, path: str) -> str:
    """A short-lived link to an uploaded output file in its bucket ("" when it cannot be made)."""
    summary = job.outputs_summary or {}
    try:
        url = parse_object_url(str(summary.get("train_url", "")))
        if url is None or not safe_key_part(path):
            return ""
        where = Storage.reach_for(str(url), job.pool_id, job.owner_id, job.owner.username)
        return where.store.presigned_get(url.bucket, url.folder_prefix + path, DOWNLOAD_LINK_SECONDS)
    except (ObjectUrlError, StoreError):
        return ""


class JobOutputs(APIView):
    @extend_schema(summary="The files a job left in its train_url", responses=OutputsSerializer)
    def get(self, request, pk):
        job = _job(request, pk)
        # A file uploaded to the owner's bucket is theirs to download (a link the console signs for them).
        uploaded = in_store(job.outputs_summary)
        files = [
            {
                "path": item.path,
                "size": item.size,
                "kept": item.kept,
                "url": reverse("api-job-output-file", args=[job.pk, item.path])
                if item.kept and (not uploaded or job.owner_id == request.user.pk) else None,
            }
            for item in job.output_files.all()
        ]
        kept = any(item["kept"] for item in files)
        return Response(
            {
                "summary": job.outputs_summary or None,
                "files": files,
                "archive_url": reverse("api-job-outputs-archive", args=[job.pk]) if kept and not uploaded else None,
            }
        )


class JobOutputDownload(APIView):
    @extend_schema(summary="Download one kept output file", responses=binary("The file."),
                   operation_id="training_jobs_outputs_file")
    def get(self, request, pk, path):
        job = _job(request, pk)
        if in_store(job.outputs_summary):
            # The bytes stay in the store: its owner is sent there with a link good for a few minutes.
            link = stored_object_url(job, path) if job.owner_id == request.user.pk and \
                job.output_files.filter(path=path, kept=True).exists() else ""
            if not link:
                raise Http404("No such output file.")
            return HttpResponseRedirect(link)
        local = stored_file(job.pk, path)
        if local is None:
            raise Http404("No such output file.")
        return FileResponse(open(local, "rb"), as_attachment=True, filename=PurePosixPath(path).name)


class JobOutputsArchive(APIView):
    @extend_schema(summary="Download every kept output file as one .tar.gz", operation_id="training_jobs_outputs_archive",
                   responses=binary("The archive.", "application/gzip"))
    def get(self, request, pk):
        job = _job(request, pk)
        if in_store(job.outputs_summary) or not job.output_files.filter(kept=True).exists():
            raise Http404("This job has no collected output.")
        # Written to a temporary file first: an archive of many files should not sit in memory.
        archive = tempfile.TemporaryFile()
        write_archive(job.pk, archive)
        archive.seek(0)
        return FileResponse(archive, as_attachment=True, filename=f"{job.dns_name}-outputs.tar.gz",
                            content_type="application/gzip")


class JobCheckpoints(generics.ListAPIView):
    """Every checkpoint the console keeps of a job (the newest CHECKPOINTS_KEPT), newest first, a page at a time:
    a program may save one every few seconds for days, so the job's own detail holds only the newest few."""

    serializer_class = CheckpointSerializer

    @extend_schema(summary="A job's checkpoints, newest first, a page at a time")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        return _job(self.request, self.kwargs["pk"]).checkpoints.all()

