"""Each worker's CPU, memory (and GPU) while its job runs, kept as ResourceSample rows for the job's charts.

The worker watch looks at every container every few seconds (jobs.runtime.liveness); a sample is kept
every RESOURCE_SAMPLE_SECONDS per worker, its CPU share computed from the cgroup's CPU time since the
last sample kept, as `podman stats` does, so the rows stay few on a long job.

A short job would get one point at most that way: the recorder also looks at the launch (twice, a
moment apart, the first look only starting the CPU count) and once more at the end, and keeps those
looks whatever the interval, so that every chart has its start and its end.
"""

import asyncio
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from jobs.models import ResourceSample
from jobs.runtime.liveness import PROBE_TIMEOUT_SECONDS, Usage, WorkerWatch

# How long after the launch's first look the second is taken: the first sample's CPU share is over this.
START_LOOK_SECONDS = 1.0


class ResourceRecorder:
    def __init__(self, job_id: int, every: float | None = None, start_look_seconds: float = START_LOOK_SECONDS):
        self.job_id = job_id
        self.every = every if every is not None else settings.RESOURCE_SAMPLE_SECONDS
        self.start_look_seconds = start_look_seconds
        # Per worker: (CPU time, when) of the last sample kept.
        self.last: dict[int, tuple[int, float]] = {}

    def samples(self, usages: dict[int, Usage], now: float, *, at_once: bool = False) -> list[ResourceSample]:
        """The samples these looks make; `at_once`: kept whatever the interval (the start and the end)."""
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
            if now <= then or (now - then < self.every and not at_once) or usage.cpu_ns < cpu_before:
                continue
            self.last[index] = (usage.cpu_ns, now)
            kept.append(ResourceSample(
                job_id=self.job_id, worker_index=index, at=at,
                cpu_percent=round((usage.cpu_ns - cpu_before) / ((now - then) * 1e9) * 100, 1),
                memory_bytes=usage.memory_bytes, memory_limit_bytes=usage.memory_limit_bytes,
                gpu_percent=usage.gpu_percent, gpu_memory_bytes=usage.gpu_memory_bytes))
        return kept

    async def take(self, usages: dict[int, Usage], *, at_once: bool = False) -> None:
        kept = self.samples(usages, time.monotonic(), at_once=at_once)
        if kept:
            await sync_to_async(ResourceSample.objects.bulk_create)(kept)

    async def look(self, watch: WorkerWatch, *, at_once: bool = True) -> None:
        """One look at every worker now, outside the watch's rhythm, on the watch's connections. Bounded as
        one probe is: a silent node neither delays the watch at the launch nor the job's end."""
        probes = [asyncio.create_task(watch.probe(worker)) for worker in watch.workers]
        if not probes:
            return
        try:
            await asyncio.wait(probes, timeout=PROBE_TIMEOUT_SECONDS)
        finally:
            for probe in probes:
                probe.cancel()
            await asyncio.gather(*probes, return_exceptions=True)
        answered = [probe.result() for probe in probes if not probe.cancelled() and probe.exception() is None]
        await self.take({probe.index: probe.usage for probe in answered if probe.usage}, at_once=at_once)

    async def follow(self, watch: WorkerWatch) -> None:
        """The watch, from the launch on: the chart's first point (two looks a moment apart), then the
        watch's own looks. Run as the watch's task, so that the looks never share a connection at once."""
        try:
            await self.look(watch)
            await asyncio.sleep(self.start_look_seconds)
            await self.look(watch)
        except BaseException:
            watch.close()
            raise
        await watch.run()

    async def last_look(self, watch: WorkerWatch) -> None:
        """The chart's last point, once the launch is over and while the containers are still up (a stop has
        ended them already: nothing is kept then)."""
        try:
            await self.look(watch)
        finally:
            watch.close()
