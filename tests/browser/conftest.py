"""A real headless Chromium (Debian's package) driven by Playwright, against the console's web server started
as `make run` starts it (the live log's Server-Sent Events need an ASGI server, which `live_server` is not).

The services (Redis, Celery, the local cluster) come from tests/conftest.py, shared with the integration tests.
"""

import os
from pathlib import Path

import pytest
from django.conf import global_settings
from django.contrib.auth import get_user_model
from playwright.sync_api import sync_playwright

from console import services
from tests.browser.helpers import PASSWORD
from tests.conftest import RUN_ID, web_server_env
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


@pytest.fixture(autouse=True)
def passwords_the_web_server_checks(settings):
    """The web server runs with the console's own settings, whose hashers check no MD5 password (the
    tests' hasher, tests/conftest.py): the users these tests sign in as get the console's hashes."""
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS


class AsgiServer:
    """The console's web server as `make run` starts it (console.services.start_web_server: the header
    deadline, forwarded addresses from TRUSTED_PROXIES only), in a process of its own on the test database.
    restart() ends it and starts it again on the same port, as a deployment would."""

    def __init__(self, port: int, redis_url: str):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        # This process allows Django's synchronous calls beside Playwright's event loop (above); the server
        # must not, as the console never does.
        self.env = {**web_server_env(redis_url), "DJANGO_ALLOW_ASYNC_UNSAFE": ""}
        self.process = None

    def start(self) -> None:
        self.process = services.start_web_server(self.port, self.env, TEST_OUTPUT / f"uvicorn-browser-{RUN_ID}.log")

    def stop(self) -> None:
        # uvicorn waits for open responses before it exits; a live log stream a page still follows would
        # hold it up to the timeout, so it is not waited for long (the page's EventSource reconnects).
        services.stop(self.process, timeout=2)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def asgi_server(transactional_db, redis_url):
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    server = AsgiServer(services.free_port(), redis_url)
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
