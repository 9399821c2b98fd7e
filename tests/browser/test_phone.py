"""The pages on a 390-px phone, in a real Chromium: nothing wider than the screen but the tables and logs
that scroll inside themselves, a skip link to the content, the site's icon at /favicon.ico."""

from playwright.sync_api import expect

from jobs.models import JobStatus
from tests.browser.helpers import log_in
from tests.browser.page_jobs import failed_job, page_job, viewer, write_lines

PHONE = {"width": 390, "height": 844}
# What an element wider than the screen is, found in the page: its tag, classes and width.
WIDE_ELEMENTS = """() => Array.from(document.querySelectorAll("body *"))
  .filter((element) => element.getBoundingClientRect().right > 391
    && !element.closest(".table, .tabs, .log-view, pre, .scroll-x"))
  .slice(0, 8).map((element) => element.tagName + "." + element.className + " " + Math.round(element.getBoundingClientRect().right))"""


def test_every_page_fits_a_390_px_phone_and_starts_with_a_skip_link(browser, asgi_server, screenshots):
    context = browser.new_context(base_url=asgi_server.url, locale="en-US", viewport=PHONE, is_mobile=True,
                                  has_touch=True)
    context.set_default_timeout(20_000)
    page = context.new_page()
    owner = viewer()
    job = failed_job(owner)
    write_lines(job, ["a line longer than any phone is wide " * 8])
    page_job(owner, "finished-fine", JobStatus.COMPLETED)
    log_in(page, owner.username)
    for name, path in [("list", "/"), ("form", "/jobs/new"), ("job", f"/jobs/{job.pk}"), ("capacity", "/capacity"),
                       ("tokens", "/tokens")]:
        page.goto(path)
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], (name, width, page.evaluate(WIDE_ELEMENTS))
        page.screenshot(path=screenshots / f"phone-{name}.png", full_page=False)

    # The log is read on a phone too: a long line's text takes the pane's width, wrapping under its time and tags.
    page.goto(f"/jobs/{job.pk}#logs")
    text = page.locator(".log-line .log-text", has_text="a line longer than any phone").first
    expect(text).to_be_visible()
    box = text.bounding_box()
    assert box is not None and box["width"] > 250 and box["height"] < 400, box

    page.goto("/")
    page.keyboard.press("Tab")
    skip = page.locator(".skip-link")
    expect(skip).to_be_focused()
    expect(skip).to_be_visible()
    skip.press("Enter")
    assert page.evaluate("location.hash") == "#main"
    assert page.request.get("/favicon.ico").ok
    context.close()
