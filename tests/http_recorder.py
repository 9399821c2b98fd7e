"""A stand-in HTTP server for the command-line client's tests: it keeps every request it was sent and
answers with what the test gives it, so a test can see what tc sent (a token, an idempotency key) and
make the console misbehave (redirect, lose an answer) without a console."""

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes = b""


# What the server says to a request; None hangs up without an answer, as a connection lost mid-request.
Answerer = Callable[[Request], Answer | None]


def json_answer(document, status: int = 200) -> Answer:
    return Answer(status, {"Content-Type": "application/json"}, json.dumps(document).encode())


def redirect_to(origin: str) -> Answerer:
    """Sends every request to the same path on `origin`."""
    return lambda request: Answer(302, {"Location": origin + request.path})


class _Handler(BaseHTTPRequestHandler):
    server: "Recorder"

    def _serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        request = Request(self.command, self.path, dict(self.headers), self.rfile.read(length))
        self.server.seen.append(request)
        answer = self.server.answer(request)
        if answer is None:
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer.body)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, *args):
        pass  # the test's output is the test's own


class Recorder(ThreadingHTTPServer):
    """Serves on `host` (a free port) from a daemon thread until `close()` or the end of a `with` block.

    `answer` may be replaced while it serves, e.g. with one that needs the server's own `url`."""

    def __init__(self, host: str = "127.0.0.1", answer: Answerer = lambda request: json_answer({})):
        super().__init__((host, 0), _Handler)
        self.answer = answer
        self.seen: list[Request] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def close(self):
        self.shutdown()
        self.server_close()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc_info):
        self.close()
