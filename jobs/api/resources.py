"""What each worker's container used while the job ran: CPU, memory, and GPU where it had GPUs."""

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.models import FINAL_STATES, ResourceSample
from jobs.results.metrics import downsample
from jobs.submission.access import visible_jobs

from .schema import ApiError

# Per worker and chart; a long job's series are downsampled (each stretch's lowest and highest kept).
MAX_POINTS = 1500


class ResourceSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = ResourceSample
        fields = ["at", "cpu_percent", "memory_bytes", "memory_limit_bytes", "gpu_percent", "gpu_memory_bytes"]
        extra_kwargs = {
            "at": {"help_text": "When the sample was taken."},
            "cpu_percent": {"help_text": "CPU use since the previous sample, in percent of one core (250: 2.5 cores)."},
            "memory_bytes": {"help_text": "Memory the container used (its cgroup's count)."},
            "memory_limit_bytes": {"help_text": "The container's memory limit (the spec's); null without one."},
            "gpu_percent": {"help_text": "Mean utilisation of the worker's GPUs; null without GPUs."},
            "gpu_memory_bytes": {"help_text": "Memory held on the worker's GPUs; null without GPUs."},
        }


class WorkerResourcesSerializer(serializers.Serializer):
    worker = serializers.IntegerField(help_text="The worker's index.")
    node = serializers.CharField(help_text="The node it ran on.")
    samples = ResourceSampleSerializer(many=True, help_text="Oldest first; a long run's downsampled.")


class JobResourcesSerializer(serializers.Serializer):
    final = serializers.BooleanField(help_text="The job has ended: no sample will be added.")
    next = serializers.IntegerField(help_text="Give it as `after` to get only the samples taken since.")
    interval_seconds = serializers.FloatField(help_text="How often a sample is taken while the job runs.")
    workers = WorkerResourcesSerializer(many=True, help_text="One entry per worker that has samples.")


class JobResources(APIView):
    @extend_schema(summary="Each worker's CPU, memory and GPU use over the job's run",
                   parameters=[OpenApiParameter("after", int, description=(
                       "Only the samples after this cursor (the `next` of an earlier answer); 0 or none: from the "
                       "start, a long run's series downsampled."))],
                   responses={200: JobResourcesSerializer, 400: ApiError})
    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        after = request.query_params.get("after", "0")
        if not after.isascii() or not after.isdigit() or len(after) > 18:
            return Response({"after": ["A whole number, the `next` of an earlier answer."]},
                            status=status.HTTP_400_BAD_REQUEST)
        # The state first: an answer that says final holds every sample there will be.
        final = job.status in FINAL_STATES
        samples = list(job.resource_samples.filter(id__gt=int(after)).order_by("at", "id"))
        nodes = dict(job.workers.values_list("index", "node_name"))
        by_worker: dict[int, list[ResourceSample]] = {}
        for sample in samples:
            by_worker.setdefault(sample.worker_index, []).append(sample)
        workers = [{"worker": index, "node": nodes.get(index, ""),
                    "samples": ResourceSampleSerializer(
                        downsample(kept, MAX_POINTS, value=lambda sample: sample.cpu_percent), many=True).data}
                   for index, kept in sorted(by_worker.items())]
        return Response({"final": final, "next": max((sample.id for sample in samples), default=int(after)),
                         "interval_seconds": settings.RESOURCE_SAMPLE_SECONDS, "workers": workers})
