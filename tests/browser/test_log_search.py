"""Searching a long log on the job page, in a real Chromium against the console under uvicorn: a 200,000-line
log, lines near its start found by text, level and pattern, counted, stepped through, and shown among the
lines around them; "no match" said only once the whole log was searched."""

from playwright.sync_api import expect

from jobs.models import JobStatus
from tests.browser.helpers import log_in
from tests.browser.page_jobs import page_job, viewer, write_lines

LOG_LINES = 200_000
ERROR_AT = 66_000  # the line's index; its sequence number is one more
SEARCH_TIMEOUT_MS = 60_000


def long_log() -> list[str]:
    lines = [f"step {number} loss=0.{number % 97:02d}" for number in range(LOG_LINES)]
    lines[ERROR_AT] = "ERROR: the loader lost shard 7"
    lines[133_333] = "checkpoint needle written"
    lines[150_000] = "UserWarning: the learning rate is very high"
    return lines


def open_long_log(page, name: str, status: str):
    """A job with the long log, its page open on the Logs tab with the newest lines loaded."""
    owner = viewer()
    job = page_job(owner, name, status)
    write_lines(job, long_log())
    log_in(page, owner.username)
    page.goto(f"/jobs/{job.pk}#logs")
    view = page.locator("[data-log-view]")
    expect(view.locator(".log-line")).to_have_count(500)
    return job, view


def test_a_search_finds_counts_and_steps_through_lines_anywhere_in_a_200000_line_log(asgi_page, screenshots):
    _job, view = open_long_log(asgi_page, "long-search", JobStatus.COMPLETED)
    counter = asgi_page.locator("[data-log-match-count]")

    # A text near the start of the log: far beyond the newest 20,000 lines the pane reads at first.
    asgi_page.fill("[data-log-search]", "lost SHARD")
    expect(view.locator(".log-line")).to_have_count(1, timeout=SEARCH_TIMEOUT_MS)
    expect(view.locator(".log-line")).to_contain_text("ERROR: the loader lost shard 7")
    expect(view.locator("mark")).to_have_text("lost shard")
    expect(counter).to_have_text("1 matching line(s)", timeout=SEARCH_TIMEOUT_MS)

    # Nothing matches: said only once the whole log was searched.
    asgi_page.fill("[data-log-search]", "no such text anywhere")
    expect(view).to_have_attribute("data-empty", "No line matches the filter.", timeout=SEARCH_TIMEOUT_MS)
    expect(counter).to_have_text("0 matching line(s)")

    # The level alone: the lines that look like errors, or like warnings too.
    asgi_page.fill("[data-log-search]", "")
    asgi_page.select_option("[data-log-level]", "error")
    expect(view.locator(".log-line")).to_have_count(1, timeout=SEARCH_TIMEOUT_MS)
    expect(view).to_contain_text("lost shard 7")
    asgi_page.select_option("[data-log-level]", "warning")
    expect(view.locator(".log-line")).to_have_count(2, timeout=SEARCH_TIMEOUT_MS)
    expect(view.locator(".log-line").last).to_contain_text("UserWarning")
    asgi_page.select_option("[data-log-level]", "")

    # A pattern: the 100 steps 199,900-199,999, counted and stepped through from the newest.
    asgi_page.check("[data-log-regex]")
    asgi_page.fill("[data-log-search]", r"^step 1999\d\d\b")
    expect(counter).to_have_text("100 matching line(s)", timeout=SEARCH_TIMEOUT_MS)
    expect(view.locator(".log-line")).to_have_count(100)
    asgi_page.press("[data-log-search]", "Enter")
    expect(counter).to_have_text("Match 100 of 100")
    expect(view.locator(".log-current")).to_contain_text("step 199999 ")
    asgi_page.press("[data-log-search]", "Enter")
    asgi_page.press("[data-log-search]", "Enter")
    expect(counter).to_have_text("Match 98 of 100")
    expect(view.locator(".log-current")).to_contain_text("step 199997 ")
    asgi_page.click("[data-log-match-next]")
    expect(counter).to_have_text("Match 99 of 100")
    expect(asgi_page.locator("[data-log-follow]")).not_to_be_checked()
    asgi_page.screenshot(path=screenshots / "job-log-search-pattern.png")

    # A match clicked: among the lines around it, every line shown, and back to the end.
    view.locator(".log-current").click()
    context = asgi_page.locator("[data-log-context]")
    expect(context).to_be_visible()
    expect(context.locator(".log-line")).to_have_count(22)  # 20 before it, itself, the last line after it
    expect(context.locator(".log-current")).to_contain_text("step 199998 ")
    expect(asgi_page.locator("[data-log-context-title]")).to_have_text(
        "Line 199,999 of 200,000, with the lines around it")
    asgi_page.click("[data-log-context-close]")
    expect(context).to_be_hidden()
    expect(asgi_page.locator("[data-log-follow]")).to_be_checked()

    # A pattern RE2 cannot run is refused where it was typed, and nothing is said about matches.
    asgi_page.fill("[data-log-search]", r"(shard)\1")
    expect(asgi_page.locator("[data-log-note]")).to_contain_text("RE2")
    expect(asgi_page.locator("[data-log-search]")).to_have_attribute("aria-invalid", "true")
    expect(view).not_to_have_attribute("data-empty", "No line matches the filter.")


def test_the_first_error_far_back_is_shown_among_its_lines_and_the_pane_keeps_following(asgi_page, screenshots):
    job, view = open_long_log(asgi_page, "far-error", JobStatus.RUNNING)

    asgi_page.click("[data-log-first-error]")
    context = asgi_page.locator("[data-log-context]")
    expect(context.locator(".log-first-error")).to_contain_text("ERROR: the loader lost shard 7")
    expect(asgi_page.locator("[data-log-context-title]")).to_have_text(
        f"Line {ERROR_AT + 1:,} of {LOG_LINES:,}, with the lines around it")
    expect(context.locator(".log-line").first).to_contain_text(f"step {ERROR_AT - 20} ")
    # The pane goes on as it was: following, and what arrives live is still added to it.
    expect(asgi_page.locator("[data-log-follow]")).to_be_checked()
    write_lines(job, ["arrived while reading the error"])
    expect(view.locator(".log-line").last).to_contain_text("arrived while reading the error")
    asgi_page.screenshot(path=screenshots / "job-log-first-error-context.png")
