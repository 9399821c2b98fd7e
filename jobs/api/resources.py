"""What each worker's container used while the job ran: CPU, memory, and GPU where it had GPUs."""

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.access import visible_jobs
from jobs.models import FINAL_STATES, ResourceSample
from jobs.results.metrics import downsample

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
    interval_seconds = serializers.FloatField(help_text="How often a sample is taken while the job runs.")
    workers = WorkerResourcesSerializer(many=True, help_text="One entry per worker that has samples.")


class JobResources(APIView):
    @extend_schema(summary="Each worker's CPU, memory and GPU use over the job's run",
                   responses={200: JobResourcesSerializer})
    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        nodes = dict(job.workers.values_list("index", "node_name"))
        by_worker: dict[int, list[ResourceSample]] = {}
        for sample in job.resource_samples.order_by("at", "id"):
            by_worker.setdefault(sample.worker_index, []).append(sample)
        workers = [{"worker": index, "node": nodes.get(index, ""),
                    "samples": ResourceSampleSerializer(
                        downsample(samples, MAX_POINTS, value=lambda sample: sample.cpu_percent), many=True).data}
                   for index, samples in sorted(by_worker.items())]
        return Response({"final": job.status in FINAL_STATES, "interval_seconds": settings.RESOURCE_SAMPLE_SECONDS,
                         "workers": workers})
