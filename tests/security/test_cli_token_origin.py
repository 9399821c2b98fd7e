"""tc keeps its token to the console it was given: a redirect elsewhere is refused before the token leaves,
and a plain-HTTP console off this machine is warned about."""

from collections.abc import Iterator

import pytest
from training_console_cli.api import Client
from training_console_cli.config import Settings
from training_console_cli.errors import CliError

from tests.http_recorder import Recorder, redirect_to

TOKEN = "tc_secret-token-of-the-user"


@pytest.fixture
def elsewhere() -> Iterator[Recorder]:
    with Recorder("127.0.0.2") as server:  # another host, as far as origins go
        yield server


@pytest.mark.attack("the console's address redirects tc to another host", "tc stops; the token never reaches that host")
def test_a_redirect_to_another_host_is_refused_and_the_token_is_not_sent_there(elsewhere):
    with Recorder(answer=redirect_to(elsewhere.url)) as console:
        with pytest.raises(CliError, match="not the console"):
            Client(Settings(console.url, TOKEN)).get("training-jobs")
    assert console.seen and console.seen[0].headers["Authorization"] == f"Token {TOKEN}"
    assert elsewhere.seen == []


def test_a_redirect_within_the_console_is_followed_with_the_token():
    with Recorder() as console:
        console.answer = redirect_to(console.url + "/moved")
        with pytest.raises(CliError):  # it redirects for ever, within itself: urllib gives up after 10
            Client(Settings(console.url, TOKEN)).get("training-jobs")
    assert len(console.seen) > 2
    assert all(request.headers["Authorization"] == f"Token {TOKEN}" for request in console.seen)


@pytest.mark.parametrize(("url", "warned"), [
    ("http://console.example.org", True), ("http://10.1.2.3:8000", True),
    ("https://console.example.org", False), ("http://127.0.0.1:8000", False), ("http://localhost:8000", False),
    ("http://[::1]:8000", False)])
def test_plain_http_off_this_machine_is_warned_about(capsys, url, warned):
    Client(Settings(url, TOKEN))
    assert ("plain HTTP" in capsys.readouterr().err) is warned
