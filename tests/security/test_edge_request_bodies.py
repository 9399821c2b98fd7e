"""Oversized request bodies against the console under a real uvicorn: each is refused once its count passes
its route's limit, before Django reads it (console.request_limits), and nothing of it is written to disk.

Anonymous clients send them, as the attack needs no account. How much the server wrote is read from
/proc/<pid>/io (`wchar`, every byte the process wrote to a file): Django spools a body it reads to a
temporary file (in memory up to 2.5 MB, then on disk), so what was read of a body is what was written.
"""

import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from console import services
from jobs.api.views import UPLOAD_FIELDS_ALLOWANCE
from tests.conftest import RUN_ID, _worker_database_env
from tests.integration.helpers import TEST_OUTPUT

MIB = 1024 * 1024
BODY_BYTES = 96 * MIB  # the attack sent 300 MB; this is enough to see whether it is read
UPLOAD_LIMIT = 4 * MIB
PIECE = 64 * 1024
DATA_LIMIT = 2621440  # DATA_UPLOAD_MAX_MEMORY_SIZE, Django's default
# What the server process may write besides the part of a body within its limit (its log lines).
LOG_ALLOWANCE = 1 * MIB


@pytest.fixture
def web_server(transactional_db, tmp_path):
    port = services.free_port()
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    env = {**_worker_database_env(), "CODE_DIR_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT), "TMPDIR": str(tmp_path),
           "REDIS_URL": f"redis://127.0.0.1:{services.free_port()}/0"}
    process = services.start_web_server(port, env, TEST_OUTPUT / f"uvicorn-edge-bodies-{RUN_ID}.log")
    yield port, process.pid
    services.stop(process)


def written_bytes(pid: int) -> int:
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["wchar"])


def fixed_length(data_bytes: int) -> Iterator[bytes]:
    piece = b"x" * PIECE
    for _ in range(data_bytes // PIECE):
        yield piece


def chunked(data: Iterator[bytes]) -> Iterator[bytes]:
    for piece in data:
        yield b"%x\r\n%s\r\n" % (len(piece), piece)
    yield b"0\r\n\r\n"


class Answer:
    def __init__(self, raw: bytes, sent: int):
        head, _, self.body = raw.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1]) if status_line else 0
        self.headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in header_lines)}
        self.sent = sent

    def json(self) -> dict:
        assert self.headers.get("content-type") == "application/json", self.headers
        return json.loads(self.body)


def send_until_answered(port: int, head: bytes, body: Iterator[bytes], timeout: float = 120) -> Answer:
    """Send the request's head, then its body as fast as the server takes it, reading all the while: as an
    attacker would, it stops only when the server answers or hangs up (or the body is all sent)."""
    client = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIECE)
    client.sendall(head)
    client.setblocking(False)
    sent, received, pending = 0, b"", b""
    deadline = time.monotonic() + timeout
    sending = True
    try:
        while time.monotonic() < deadline:
            if sending and not pending:
                pending = next(body, b"")
                sending = bool(pending)
            readable, writable, _ = select.select([client], [client] if sending else [], [], 1.0)
            if readable:
                try:
                    data = client.recv(PIECE)
                except ConnectionResetError:
                    break
                if not data:
                    break
                received += data
                sending = False  # answered: an attacker would go on, but the answer is what the test reads
                continue
            if writable:
                try:
                    count = client.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    sending = False
                    continue
                sent += count
                pending = pending[count:]
        return Answer(received, sent)
    finally:
        client.close()


def request_head(path: str, content_type: str, length: int | None) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: {content_type}\r\n{framing}\r\n"
            "\r\n").encode()


def multipart_upload() -> Iterator[bytes]:
    yield (b'--edge\r\nContent-Disposition: form-data; name="name"\r\n\r\nbig\r\n--edge\r\nContent-Disposition: '
           b'form-data; name="archive"; filename="big.zip"\r\nContent-Type: application/zip\r\n\r\n')
    yield from fixed_length(BODY_BYTES)


CASES = {
    "JSON API, Content-Length": (
        request_head("/api/v1/training-jobs", "application/json", BODY_BYTES), lambda: fixed_length(BODY_BYTES),
        DATA_LIMIT),
    "JSON API, chunked": (
        request_head("/api/v1/training-jobs", "application/json", None), lambda: chunked(fixed_length(BODY_BYTES)),
        DATA_LIMIT),
    "multipart upload, chunked": (
        request_head("/api/v1/code-dirs", "multipart/form-data; boundary=edge", None),
        lambda: chunked(multipart_upload()), UPLOAD_LIMIT + UPLOAD_FIELDS_ALLOWANCE),
    "sign-in page, Content-Length": (
        request_head("/accounts/login/", "application/x-www-form-urlencoded", BODY_BYTES),
        lambda: fixed_length(BODY_BYTES), DATA_LIMIT),
}


@pytest.mark.attack("an anonymous 96 MB body (JSON, chunked JSON, chunked upload, sign-in form)",
                    "a 413 once past its route's limit, no more of it read or spooled; JSON on API routes")
@pytest.mark.parametrize("case", list(CASES))
def test_an_oversized_body_is_refused_before_it_is_read_or_spooled_to_disk(web_server, case):
    port, pid = web_server
    head, body, limit = CASES[case]
    written_before = written_bytes(pid)

    answer = send_until_answered(port, head, body())

    written = written_bytes(pid) - written_before
    print(f"{case}: {answer.status} after {answer.sent} bytes sent; the server wrote {written} bytes")
    assert answer.status == 413, (answer.status, answer.body[:300])
    assert answer.headers.get("connection") == "close"
    # Django spools what it reads to a temporary file: the part within the limit at most, never the rest.
    assert written < limit + LOG_ALLOWANCE, f"the server wrote {written} bytes while refusing the body"
    assert answer.sent < BODY_BYTES, "the answer came only after the whole body was sent"
    if case.startswith("JSON API"):
        assert answer.json() == {"detail": f"The request body is too large: at most {DATA_LIMIT} bytes."}
    elif case.startswith("multipart upload"):
        assert answer.json() == {"archive": [
            f"the upload is larger than {UPLOAD_LIMIT} bytes, the most that may be uploaded"]}
    else:
        assert answer.headers["content-type"].startswith("text/plain")
        assert f"at most {DATA_LIMIT} bytes".encode() in answer.body


def test_a_body_within_its_limit_still_reaches_the_application(web_server):
    """The limits refuse what is over them only: a chunked JSON body within the limit gets the API's own answer."""
    port, _ = web_server
    body = json.dumps({"name": "x"}).encode()
    answer = send_until_answered(port, request_head("/api/v1/training-jobs", "application/json", None),
                                 chunked(iter([body])))
    assert answer.status == 401, (answer.status, answer.body[:300])
    assert answer.json() == {"detail": "Authentication credentials were not provided."}


def test_an_upload_within_its_larger_limit_is_read_whole(web_server, token):
    """The upload route takes more than any other: a 3 MiB archive (over the 2.5 MB of other routes) is read
    whole and judged by the upload view itself (it is no zip: a field error, not a 413)."""
    port, _ = web_server
    body = (b'--edge\r\nContent-Disposition: form-data; name="name"\r\n\r\nthree\r\n--edge\r\n'
            b'Content-Disposition: form-data; name="archive"; filename="a.zip"\r\nContent-Type: application/zip\r\n\r\n'
            + b"x" * (3 * MIB) + b"\r\n--edge--\r\n")
    head = request_head("/api/v1/code-dirs", "multipart/form-data; boundary=edge", len(body))
    head = head.replace(b"\r\n\r\n", f"\r\nAuthorization: Token {token}\r\n\r\n".encode())
    answer = send_until_answered(port, head, iter([body]))
    assert answer.status == 400, (answer.status, answer.body[:300])
    assert list(answer.json()) == ["archive"], answer.json()
    assert "larger than" not in answer.json()["archive"][0]
