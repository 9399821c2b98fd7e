"""A real headless Chromium (Debian's package) driven by Playwright, against the console served by `live_server`.

The services (Redis, Celery, the local cluster) come from tests/conftest.py, shared with the integration tests.
"""

import os
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import sync_playwright

from tests.browser.helpers import PASSWORD
from tests.integration.helpers import TEST_OUTPUT

# Playwright's sync API keeps an event loop running in this thread; the tests' own ORM calls are
# still plain synchronous code, which Django would otherwise refuse beside a running loop.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = TEST_OUTPUT / "screenshots"


def pytest_collection_modifyitems(items):
    for item in items:
        if "browser" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (apt-get install chromium)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(base_url=live_server.url, locale="en-US", viewport={"width": 1440, "height": 1000})
    context.set_default_timeout(20_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def screenshots():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


@pytest.fixture
def owner(console):
    return get_user_model().objects.create_user("owner", password=PASSWORD)
