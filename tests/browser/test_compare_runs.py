"""Comparing runs in a real Chromium: two jobs ticked in the list, "Compare selected", and the comparison shows
the parameter that differs and one line per job on the metric's chart."""

from django.utils import timezone
from playwright.sync_api import expect

from jobs.models import JobStatus, MetricPoint
from tests.browser.helpers import log_in
from tests.browser.page_jobs import page_job, viewer


def run_with_loss(owner, name: str, lr: str, **fields):
    job = page_job(owner, name, JobStatus.COMPLETED, ended_at=timezone.now(), final_metrics={"loss": 0.1},
                   parameters=[{"name": "lr", "value": lr}, {"name": "steps", "value": "5"}], **fields)
    MetricPoint.objects.bulk_create(MetricPoint(job=job, name="loss", rank=0, step=step, value=float(lr) * 10 / (step + 1),
                                                at=timezone.now(), seq=step + 1) for step in range(5))
    return job


def test_two_jobs_ticked_in_the_list_are_compared_with_their_differing_parameter_and_two_lines(asgi_page, screenshots):
    owner = viewer()
    first = run_with_loss(owner, "lr-small", "0.01")
    second = run_with_loss(owner, "lr-large", "0.1", rebuilt_from=first)
    log_in(asgi_page, owner.username)

    asgi_page.goto("/")
    expect(asgi_page.locator(f'tr[data-job-id="{second.pk}"] [data-rebuild-of="{first.pk}"]')).to_be_visible()
    compare = asgi_page.locator("[data-compare]")
    expect(compare).to_be_disabled()
    asgi_page.check(f'tr[data-job-id="{first.pk}"] [data-select-job]')
    asgi_page.check(f'tr[data-job-id="{second.pk}"] [data-select-job]')
    compare.click()

    asgi_page.wait_for_url("**/jobs/compare?ids=*")
    row = asgi_page.locator('[data-compare-differences] tr[data-key="lr"]')
    expect(row).to_contain_text("0.01")
    expect(row).to_contain_text("0.1")
    assert asgi_page.locator('[data-compare-differences] tr[data-key="steps"]').count() == 0
    chart = asgi_page.locator('figure[data-metric="loss"]')
    expect(chart).to_have_attribute("data-series", "2")
    legend = chart.inner_text()
    assert "lr-small" in legend and "lr-large" in legend
    asgi_page.screenshot(path=screenshots / "compare-runs.png", full_page=True)
