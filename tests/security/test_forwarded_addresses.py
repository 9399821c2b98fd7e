"""The web server believes X-Forwarded-For only from the proxies it is told to trust, so a client cannot choose
the address its bad tokens are counted against: rotating the header buys no more guesses."""

import http.client
from collections.abc import Iterator

import pytest

from console import services
from jobs.models import ApiToken
from tests.conftest import RUN_ID, _worker_database_env
from tests.integration.helpers import TEST_OUTPUT

LIMIT = 5


def serve(settings, trusted_proxies: str) -> tuple[int, object]:
    port = services.free_port()
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    env = {**_worker_database_env(), "TRUSTED_PROXIES": trusted_proxies, "API_TOKEN_FAILURE_LIMIT": str(LIMIT),
           "REDIS_URL": f"redis://127.0.0.1:{services.free_port()}/0"}
    # The command is built with this process's settings (pytest-django's wrapper puts them back after).
    settings.TRUSTED_PROXIES = [item for item in trusted_proxies.split(",") if item]
    process = services.start_web_server(port, env, TEST_OUTPUT / f"uvicorn-forwarded-{RUN_ID}.log")
    return port, process


@pytest.fixture
def web_server(transactional_db, settings) -> Iterator[int]:
    port, process = serve(settings, "")
    yield port
    services.stop(process)


def get_jobs(port: int, token: str, forwarded_for: str | None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Token {token}"}
    if forwarded_for:
        headers["X-Forwarded-For"] = forwarded_for
    connection.request("GET", "/api/v1/training-jobs", headers=headers)
    status = connection.getresponse().status
    connection.close()
    return status


@pytest.mark.attack("bad API tokens sent with a new X-Forwarded-For each time, from the console's own host",
                    "counted against the real address: refused after the limit all the same")
def test_rotating_x_forwarded_for_buys_no_more_token_guesses(web_server):
    answers = [get_jobs(web_server, f"tc_guess{attempt}", f"203.0.113.{attempt + 1}") for attempt in range(LIMIT + 3)]

    assert answers[:LIMIT] == [401] * LIMIT
    assert answers[LIMIT:] == [429] * 3


def test_a_trusted_proxys_forwarded_address_is_the_one_counted(transactional_db, owner, settings):
    port, process = serve(settings, "127.0.0.1")
    try:
        guesses = [get_jobs(port, f"tc_guess{attempt}", "203.0.113.7") for attempt in range(LIMIT + 1)]
        token = ApiToken.issue(owner, "cli")[1]
        elsewhere = get_jobs(port, token, "198.51.100.9")
    finally:
        services.stop(process)

    assert guesses == [401] * LIMIT + [429]
    assert elsewhere == 200, "another client behind the proxy is not locked out by the guesser"
