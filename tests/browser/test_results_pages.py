"""The results on the job page in a real Chromium: the loss chart grows while the example trains, and a
silent rank's warning appears without a reload and offers the stop."""

import re

from playwright.sync_api import expect

from jobs.code_dirs.service import register_examples
from jobs.models import JobStatus, TrainingJob
from jobs.submission.forms import TrainingJobForm
from jobs.submission.jobs import submit_job
from tests.browser.helpers import log_in
from tests.integration.helpers import code_dir_from_program, wait_for

STEPS = 8


def submit(owner, **data) -> TrainingJob:
    form = TrainingJobForm(data={"engine": "local-mpi4py", "spec": "local-cpu", "node_count": 2, **data})
    assert form.is_valid(), form.errors
    return submit_job(form, owner)


def chart_points(page) -> int:
    """The steps the loss chart has drawn (its x values)."""
    return int(page.locator('[data-metric="loss"]').get_attribute("data-points") or 0)


def test_the_loss_chart_grows_while_the_example_trains_and_ends_with_one_point_per_step(page, owner, console):
    register_examples()
    job = submit(owner, name="chart", code_dir="gpu-train", boot_file="train.py",
                 parameters=[{"name": "steps", "value": str(STEPS)}, {"name": "step_seconds", "value": "0.8"}])
    log_in(page, "owner")
    wait_for(job, [JobStatus.RUNNING])
    page.goto(f"/jobs/{job.pk}#metrics")

    chart = page.locator('[data-metric="loss"]')
    expect(chart).to_have_attribute("data-points", re.compile(r"\d+"), timeout=60_000)
    seen_while_running = chart_points(page)
    expect(chart).to_have_attribute("data-points", str(STEPS), timeout=60_000)
    expect(chart.locator("[data-metric-last]")).to_have_attribute("data-step", str(STEPS))
    expect(chart.locator("[data-metric-last]")).to_have_attribute("data-rank", "0")
    assert 0 < seen_while_running < STEPS, "the chart was drawn while the job ran, then grew"
    expect(page.locator('[data-metric="accuracy"] .hint')).to_have_text("No log line matched this metric.", timeout=30_000)


def test_a_silent_rank_shows_on_the_page_and_its_owner_stops_the_job_from_there(page, owner, console):
    code_dir_from_program("results-hang-page", "hang.py")
    job = submit(owner, name="hangs", code_dir="results-hang-page", boot_file="hang.py",
                 parameters=[{"name": "rank", "value": "3"}], watchdog_seconds=8)
    log_in(page, "owner")
    wait_for(job, [JobStatus.RUNNING])
    page.goto(f"/jobs/{job.pk}")

    banner = page.locator("[data-hung-banner]")
    expect(banner).to_contain_text("Suspected hung", timeout=30_000)
    expect(banner.locator("tbody tr")).to_have_count(1)
    expect(banner.locator("tbody td").first).to_have_text("3")
    page.once("dialog", lambda dialog: dialog.accept())
    banner.get_by_role("button", name="Stop the job").click()

    wait_for(job, [JobStatus.TERMINATED], timeout=60)
    page.goto(f"/jobs/{job.pk}")
    expect(page.locator("[data-cleanup]")).to_have_attribute("data-cleanup", "clean")
    expect(page.locator("[data-hung-banner]")).to_contain_text("Was suspected hung")
