"""The pages as people read them, in a real Chromium against the console under uvicorn, with jobs written
straight into the database (no cluster): why a job failed in its header, the log followed live over
Server-Sent Events (across a server restart), older lines on scroll-up, the metrics headline equal to the
chart's last point while the job runs, the page in pt-BR, one poller that backs off, the form's row errors,
and the list's in-place rows and bulk actions."""

import re
from datetime import datetime
from zoneinfo import ZoneInfo

from playwright.sync_api import expect

from jobs.models import JobStatus
from tests.browser.helpers import add_rows, log_in
from tests.browser.page_jobs import failed_job, page_job, viewer, write_lines, write_metric
from tests.unit.test_translations import untranslatable_free_msgids


def sign_in(page, owner) -> None:
    log_in(page, owner.username)


def test_a_failed_jobs_cause_is_in_the_header_without_scrolling(asgi_page, screenshots):
    owner = viewer()
    job = failed_job(owner)
    sign_in(asgi_page, owner)
    asgi_page.goto(f"/jobs/{job.pk}")

    cause = asgi_page.locator("[data-job-cause]")
    expect(cause).to_contain_text("mpirun could not start or reach its daemon on node-1")
    expect(cause).to_contain_text("ORTE was unable to reliably start one or more daemons.")
    box = cause.bounding_box()
    assert box and box["y"] + box["height"] <= 900, f"the cause ends at {box} of a 900 px window"
    assert "ConnectionLost(" not in asgi_page.content()
    asgi_page.screenshot(path=screenshots / "job-failed-header.png")
    # Times in one format, in the browser's zone.
    times = asgi_page.locator("#job-timeline time").all_inner_texts()
    assert times and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text) for text in times), times
    first = asgi_page.locator("#job-timeline time").first
    written = datetime.fromisoformat(first.get_attribute("datetime")).astimezone(ZoneInfo("America/Sao_Paulo"))
    assert first.inner_text() == written.strftime("%Y-%m-%d %H:%M:%S"), "shown in the browser's zone"


def test_the_log_follows_over_sse_and_resumes_after_the_server_restarts(asgi_page, asgi_server, screenshots):
    owner = viewer()
    job = page_job(owner, "follows", JobStatus.RUNNING)
    write_lines(job, [f"line {number}" for number in range(5)])
    sign_in(asgi_page, owner)
    asgi_page.goto(f"/jobs/{job.pk}#logs")
    view = asgi_page.locator("[data-log-view]")
    expect(view.locator(".log-line")).to_have_count(5)
    expect(asgi_page.locator("[data-log-live]")).to_be_visible()

    write_lines(job, ["arrived live"])
    expect(view).to_contain_text("arrived live")
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", view.locator(".log-at").last.inner_text())

    asgi_server.restart()
    write_lines(job, ["after the restart"])
    expect(view).to_contain_text("after the restart", timeout=30_000)
    expect(view.locator(".log-line")).to_have_count(7)
    texts = view.locator(".log-text").all_inner_texts()
    assert texts == [f"line {number}" for number in range(5)] + ["arrived live", "after the restart"], "no line lost or repeated"
    asgi_page.screenshot(path=screenshots / "job-log-live.png")


def test_older_lines_load_on_scroll_up_and_the_filter_marks_its_matches(asgi_page, screenshots):
    owner = viewer()
    job = page_job(owner, "long-log", JobStatus.COMPLETED)
    long_line = "a line longer than the pane is wide, " * 12
    write_lines(job, [f"old {number:04d}" for number in range(1200)] + [long_line, "Traceback (most recent call last):",
                                                                       "ValueError: bad"])
    sign_in(asgi_page, owner)
    asgi_page.goto(f"/jobs/{job.pk}#logs")
    view = asgi_page.locator("[data-log-view]")
    expect(view.locator(".log-line")).to_have_count(500)
    view.evaluate("element => { element.scrollTop = 0; }")
    expect(view.locator(".log-line")).to_have_count(1000)
    expect(asgi_page.locator("[data-log-follow]")).not_to_be_checked()
    view.evaluate("element => { element.scrollTop = 0; }")
    expect(view.locator(".log-line")).to_have_count(1203)
    expect(view.locator(".log-line").first).to_contain_text("old 0000")

    asgi_page.click("[data-log-first-error]")
    expect(view.locator(".log-first-error")).to_contain_text("Traceback")
    asgi_page.screenshot(path=screenshots / "job-log-first-error.png")

    asgi_page.fill("[data-log-search]", "0042")
    expect(view.locator(".log-line")).to_have_count(1)
    expect(view.locator("mark")).to_have_text("0042")
    asgi_page.fill("[data-log-search]", "no such text anywhere")
    expect(view.locator(".log-line")).to_have_count(0)
    expect(view).to_have_attribute("data-empty", "No line matches the filter.")
    asgi_page.screenshot(path=screenshots / "job-log-empty-filter.png")


def test_the_metrics_headline_is_the_charts_last_rank_0_point_while_the_job_runs(asgi_page, screenshots):
    owner = viewer()
    job = page_job(owner, "learning", JobStatus.RUNNING)
    write_metric(job, "loss", [(rank, step, 1.0 / (step + 1) + rank) for step in range(10) for rank in (0, 1)])
    sign_in(asgi_page, owner)
    asgi_page.goto(f"/jobs/{job.pk}#metrics")
    headline = asgi_page.locator('[data-metric="loss"] [data-metric-last]')
    expect(headline).to_have_attribute("data-value", str(1.0 / 10))
    expect(headline).to_have_attribute("data-rank", "0")
    expect(headline).to_contain_text("rank 0")
    assert asgi_page.locator('[data-metric="loss"] .uplot').count() == 1

    write_metric(job, "loss", [(1, 10, 5.0), (0, 10, 0.05)])
    expect(headline).to_have_attribute("data-value", "0.05", timeout=15_000)
    asgi_page.screenshot(path=screenshots / "job-metrics.png")


def test_the_whole_job_page_is_in_portuguese(browser, asgi_server, screenshots):
    owner = viewer()
    job = failed_job(owner, "quebrado")
    context = browser.new_context(base_url=asgi_server.url, locale="pt-BR", viewport={"width": 1400, "height": 900})
    page = context.new_page()
    sign_in(page, owner)
    page.goto(f"/jobs/{job.pk}")
    expect(page.locator("html")).to_have_attribute("lang", "pt-br")
    page.screenshot(path=screenshots / "job-page-pt-BR.png")
    # mpirun's words, the log and the command are shown as they were written, in no language of the page.
    shown = []
    for tab in ("overview", "logs", "metrics", "nccl", "command"):
        page.click(f"#tab-{tab}")
        shown.append(page.evaluate("""() => {
            const parts = [document.querySelector('#job-head'), document.querySelector('[data-tab-panel]:not([hidden])')];
            return parts.map((part) => {
                const copy = part.cloneNode(true);
                copy.querySelectorAll('pre, code, .log-view, script, option:not(:checked)').forEach((node) => node.remove());
                const attributes = [...copy.querySelectorAll('[placeholder], [aria-label], [title]')]
                    .map((node) => node.getAttribute('placeholder') || node.getAttribute('aria-label') || node.title);
                return copy.textContent + '\\n' + attributes.join('\\n');
            }).join('\\n'); }"""))
    text = "\n".join(shown)
    english_left = [msgid for msgid in untranslatable_free_msgids()
                    if re.search(r"(?<![\w'-])" + re.escape(msgid) + r"(?![\w'-])", text)]
    context.close()
    assert not english_left, english_left


def test_every_bad_environment_row_is_reported_beside_it_and_the_first_has_the_focus(asgi_page, screenshots):
    from jobs.code_dirs.service import register_examples
    from jobs.models import CodeDirectory

    owner = viewer()
    page_job(owner, "earlier", JobStatus.COMPLETED)  # the engine and spec the form offers
    register_examples()
    sign_in(asgi_page, owner)
    asgi_page.goto("/jobs/new")
    asgi_page.fill("#id_name", "earlier")
    expect(asgi_page.locator("[data-name-taken]")).to_contain_text("You already have a job named earlier")
    asgi_page.fill("#id_name", "rows")
    asgi_page.select_option("#id_code_dir", value=str(CodeDirectory.objects.get(name="gpu-train").pk))
    expect(asgi_page.locator("#id_boot_file")).to_have_value("train.py")  # its one Python file
    add_rows(asgi_page, "env", [("GOOD", "1"), ("MA_HOME", "x"), ("1BAD", "y"), ("LD_PRELOAD", "/x.so")])
    asgi_page.click("#submit-job")

    errors = asgi_page.locator('[data-row-error="env"]')
    expect(errors).to_have_count(3)
    expect(errors.nth(0)).to_contain_text("MA_HOME")
    expect(errors.nth(1)).to_contain_text("1BAD")
    expect(errors.nth(2)).to_contain_text("LD_PRELOAD")
    rows = asgi_page.locator('[data-rows="env"] tbody tr')
    expect(rows.nth(0).locator('[data-row-error]')).to_have_count(0)
    focused = asgi_page.evaluate("document.activeElement.closest('tr') && "
                                 "document.activeElement.closest('tr').querySelector('input[name=env_name]').value")
    assert focused == "MA_HOME", "the first wrong row has the focus"
    # Hint and error say the node limit in the same words (the pool has none of this spec here).
    limit = "The pool has 0 node(s) of this spec; ask for at most that many."
    expect(asgi_page.locator('[data-errors-for="node_count"]')).to_have_text(limit)
    expect(asgi_page.locator("[data-node-hint]")).to_contain_text(limit)
    asgi_page.screenshot(path=screenshots / "job-form-env-rows.png", full_page=True)


def test_the_list_updates_its_rows_in_place_and_deletes_the_ticked_jobs_after_asking(asgi_page, screenshots):
    from jobs.models import TrainingJob

    owner = viewer()
    running = page_job(owner, "going", JobStatus.RUNNING)
    done = page_job(owner, "done", JobStatus.COMPLETED)
    sign_in(asgi_page, owner)
    asgi_page.evaluate("window.notReloaded = true")
    row = asgi_page.locator(f'tr[data-job-id="{running.pk}"]')
    row.locator("[data-select-job]").check()
    TrainingJob.objects.filter(pk=running.pk).update(status=JobStatus.FAILED)
    expect(row.locator("[data-state-badge]")).to_have_text("Failed", timeout=15_000)
    assert asgi_page.evaluate("window.notReloaded"), "the rows were swapped in place"
    expect(row.locator("[data-select-job]")).to_be_checked()
    asgi_page.locator(f'tr[data-job-id="{done.pk}"] [data-select-job]').check()
    expect(asgi_page.locator("[data-selected-count]")).to_have_text("2 selected")
    asgi_page.screenshot(path=screenshots / "job-list-selected.png")

    questions = []
    asgi_page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
    asgi_page.click('[data-bulk][value="delete"]')
    expect(asgi_page.locator(".messages")).to_contain_text("Deleted: ")
    assert questions and "Delete the selected finished jobs" in questions[0]
    assert not TrainingJob.objects.filter(pk__in=[running.pk, done.pk]).exists()


def test_a_series_of_200000_points_is_drawn_downsampled_with_its_last_point_kept(asgi_page):
    owner = viewer()
    job = page_job(owner, "long-run", JobStatus.COMPLETED)
    write_metric(job, "loss", [(0, step, 1.0 / (step + 1)) for step in range(200_000)])
    sign_in(asgi_page, owner)
    errors = []
    asgi_page.on("pageerror", lambda error: errors.append(str(error)))
    asgi_page.goto(f"/jobs/{job.pk}#metrics")

    chart = asgi_page.locator('[data-metric="loss"]')
    expect(chart.locator("[data-metric-last]")).to_have_attribute("data-step", "199999", timeout=60_000)
    assert int(chart.get_attribute("data-points")) <= 2000
    expect(chart.locator(".hint")).to_contain_text("downsampled")
    assert not errors, errors


def test_one_poller_asks_for_the_live_parts_and_backs_off_while_the_tab_is_hidden(asgi_page):
    owner = viewer()
    job = page_job(owner, "watched", JobStatus.RUNNING)
    sign_in(asgi_page, owner)
    asked = []
    asgi_page.on("request", lambda request: asked.append(request.url) if "/live" in request.url or "/api/" in request.url else None)
    asgi_page.goto(f"/jobs/{job.pk}")
    asgi_page.wait_for_timeout(7000)
    live = [url for url in asked if "/live" in url]
    assert 1 <= len(live) <= 3, live
    assert not [url for url in asked if "/outcome" in url or "/nccl" in url], "no panel polls on its own"

    asgi_page.evaluate("Object.defineProperty(document, 'hidden', { configurable: true, get: () => true })")
    asked.clear()
    asgi_page.wait_for_timeout(9500)
    assert not [url for url in asked if "/live" in url], "a hidden tab is asked for nothing for a while"
    asgi_page.evaluate("Object.defineProperty(document, 'hidden', { configurable: true, get: () => false });"
                       "document.dispatchEvent(new Event('visibilitychange'))")
    asgi_page.wait_for_timeout(1000)
    assert [url for url in asked if "/live" in url], "showing the tab asks at once"

    from jobs.models import TrainingJob
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    expect(asgi_page.locator("#job-head [data-state-badge]")).to_have_text("Completed", timeout=10_000)
    expect(asgi_page.locator("#job-poller")).not_to_have_attribute("hx-get", re.compile(".*"))
    asked.clear()
    asgi_page.wait_for_timeout(4000)
    assert not [url for url in asked if "/live" in url], "an ended job is not polled"


def test_what_the_reader_unfolded_stays_unfolded_across_the_polls(asgi_page):
    owner = viewer()
    job = failed_job(owner, "still-tearing-down")
    from jobs.models import TrainingJob
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.TERMINATING)  # not over: still polled
    sign_in(asgi_page, owner)
    with asgi_page.expect_response(lambda response: "/live" in response.url, timeout=10_000):
        asgi_page.goto(f"/jobs/{job.pk}")
    asgi_page.click("#failure-mpirun summary")
    with asgi_page.expect_response(lambda response: "/live" in response.url, timeout=10_000):
        pass
    asgi_page.wait_for_timeout(300)
    expect(asgi_page.locator("#failure-mpirun")).to_have_attribute("open", "")
