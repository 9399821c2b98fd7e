"""Each worker's CPU, memory (and GPU) while its job runs, kept as ResourceSample rows for the job's charts.

The worker watch looks at every container every few seconds (jobs.runtime.liveness); a sample is kept
every RESOURCE_SAMPLE_SECONDS per worker, its CPU share computed from the cgroup's CPU time since the
last sample kept, as `podman stats` does, so the rows stay few on a long job.
"""

import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from jobs.models import ResourceSample
from jobs.runtime.liveness import Usage


class ResourceRecorder:
    def __init__(self, job_id: int, every: float | None = None):
        self.job_id = job_id
        self.every = every if every is not None else settings.RESOURCE_SAMPLE_SECONDS
        # Per worker: (CPU time, when) of the last sample kept.
        self.last: dict[int, tuple[int, float]] = {}

    def samples(self, usages: dict[int, Usage], now: float) -> list[ResourceSample]:
        kept = []
        at = timezone.now()
        for index, usage in sorted(usages.items()):
            if usage.cpu_ns is None or usage.memory_bytes is None:
                continue
            before = self.last.get(index)
            if before is None:
                self.last[index] = (usage.cpu_ns, now)
                continue
            cpu_before, then = before
            if now - then < self.every or usage.cpu_ns < cpu_before:
                continue
            self.last[index] = (usage.cpu_ns, now)
            kept.append(ResourceSample(
                job_id=self.job_id, worker_index=index, at=at,
                cpu_percent=round((usage.cpu_ns - cpu_before) / ((now - then) * 1e9) * 100, 1),
                memory_bytes=usage.memory_bytes, memory_limit_bytes=usage.memory_limit_bytes,
                gpu_percent=usage.gpu_percent, gpu_memory_bytes=usage.gpu_memory_bytes))
        return kept

    async def take(self, usages: dict[int, Usage]) -> None:
        kept = self.samples(usages, time.monotonic())
        if kept:
            await sync_to_async(ResourceSample.objects.bulk_create)(kept)
