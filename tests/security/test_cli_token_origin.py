"""tc keeps its token to the console it was given: a redirect elsewhere is refused before the token leaves,
and a plain-HTTP console off this machine is warned about."""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from training_console_cli.api import Client
from training_console_cli.config import Settings
from training_console_cli.errors import CliError

TOKEN = "tc_secret-token-of-the-user"


class Recorder(BaseHTTPRequestHandler):
    """Answers every GET: a redirect to `redirect_to` when the server has one, else `{}`; records the headers."""

    def do_GET(self):
        self.server.seen.append(dict(self.headers))  # type: ignore[attr-defined]
        target = self.server.redirect_to  # type: ignore[attr-defined]
        if target:
            self.send_response(302)
            self.send_header("Location", target + self.path)
            self.end_headers()
            return
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(host: str, redirect_to: str = "") -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, 0), Recorder)
    server.seen, server.redirect_to = [], redirect_to  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def elsewhere() -> Iterator[ThreadingHTTPServer]:
    server = serve("127.0.0.2")  # another host, as far as origins go
    yield server
    server.shutdown()


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


@pytest.mark.attack("the console's address redirects tc to another host", "tc stops; the token never reaches that host")
def test_a_redirect_to_another_host_is_refused_and_the_token_is_not_sent_there(elsewhere):
    console = serve("127.0.0.1", redirect_to=url_of(elsewhere))
    try:
        with pytest.raises(CliError, match="not the console"):
            Client(Settings(url_of(console), TOKEN)).get("training-jobs")
    finally:
        console.shutdown()
    assert console.seen and console.seen[0]["Authorization"] == f"Token {TOKEN}"
    assert elsewhere.seen == []


def test_a_redirect_within_the_console_is_followed_with_the_token():
    console = serve("127.0.0.1")
    console.redirect_to = url_of(console) + "/moved"  # type: ignore[attr-defined]
    try:
        with pytest.raises(CliError):  # it redirects for ever, within itself: urllib gives up after 10
            Client(Settings(url_of(console), TOKEN)).get("training-jobs")
    finally:
        console.shutdown()
    assert len(console.seen) > 2
    assert all(headers["Authorization"] == f"Token {TOKEN}" for headers in console.seen)


@pytest.mark.parametrize(("url", "warned"), [
    ("http://console.example.org", True), ("http://10.1.2.3:8000", True),
    ("https://console.example.org", False), ("http://127.0.0.1:8000", False), ("http://localhost:8000", False),
    ("http://[::1]:8000", False)])
def test_plain_http_off_this_machine_is_warned_about(capsys, url, warned):
    Client(Settings(url, TOKEN))
    assert ("plain HTTP" in capsys.readouterr().err) is warned
