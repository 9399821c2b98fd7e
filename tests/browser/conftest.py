"""A real headless Chromium (Debian's package) driven by Playwright, against the console under uvicorn (as
`make run` serves it: the live log's Server-Sent Events need an ASGI server, which `live_server` is not).

The services (Redis, Celery, the local cluster) come from tests/conftest.py, shared with the integration tests.
"""

import os
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from django.contrib.auth import get_user_model
from playwright.sync_api import sync_playwright

from console import services
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
def screenshots():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


@pytest.fixture
def owner(console):
    return get_user_model().objects.create_user("owner", password=PASSWORD)


class AsgiServer:
    """The console under uvicorn in this process, as `make run` serves it: the live log's stream (an async
    view) needs an ASGI server, which `live_server` is not. restart() ends it and starts it again on the
    same port, as a deployment would."""

    def __init__(self, port: int):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.server = None
        self.thread = None

    def start(self) -> None:
        config = uvicorn.Config("console.asgi:application", host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.server.force_exit = True
        self.thread.join(15)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def asgi_server(transactional_db, redis_server):
    server = AsgiServer(services.free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def page(browser, asgi_server):
    context = browser.new_context(base_url=asgi_server.url, locale="en-US", viewport={"width": 1440, "height": 1000})
    context.set_default_timeout(20_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def asgi_context(browser, asgi_server):
    """A browser context on the ASGI console at 1400x900, a common laptop's window."""
    context = browser.new_context(base_url=asgi_server.url, locale="en-US", timezone_id="America/Sao_Paulo",
                                  viewport={"width": 1400, "height": 900})
    context.set_default_timeout(20_000)
    yield context
    context.close()


@pytest.fixture
def asgi_page(asgi_context):
    return asgi_context.new_page()
