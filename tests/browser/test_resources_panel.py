"""The job's resource charts in a real Chromium: each worker's CPU and memory drawn from its samples, with the
memory limit beside it, on the metrics tab; no GPU chart for a job without GPUs."""

from datetime import timedelta

from django.utils import timezone
from playwright.sync_api import expect

from jobs.models import JobStatus, ResourceSample
from tests.browser.helpers import log_in
from tests.browser.page_jobs import page_job, viewer


def test_each_workers_cpu_and_memory_are_charted_on_the_metrics_tab(asgi_page, screenshots):
    owner = viewer()
    job = page_job(owner, "sampled", JobStatus.RUNNING)
    start = timezone.now() - timedelta(minutes=2)
    for index in (0, 1):
        ResourceSample.objects.bulk_create(
            ResourceSample(job=job, worker_index=index, at=start + timedelta(seconds=15 * step),
                           cpu_percent=50.0 + step + index, memory_bytes=(200 + step) * 1024 * 1024,
                           memory_limit_bytes=4 * 1024**3)
            for step in range(8))
    log_in(asgi_page, owner.username)
    asgi_page.goto(f"/jobs/{job.pk}#metrics")

    panel = asgi_page.locator("[data-resources-panel]")
    expect(panel.locator('figure[data-resource="cpu"]')).to_have_attribute("data-points", "8")
    expect(panel.locator('figure[data-resource="memory"]')).to_have_attribute("data-points", "8")
    legend = panel.locator('figure[data-resource="memory"]').inner_text()
    assert "worker-0 (node-0)" in legend and "worker-1 (node-1)" in legend and "limit" in legend
    assert panel.locator('figure[data-resource="gpu"]').count() == 0, "no GPU chart for a job without GPUs"
    panel.scroll_into_view_if_needed()
    asgi_page.screenshot(path=screenshots / "job-resources.png", full_page=False)
