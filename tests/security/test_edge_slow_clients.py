"""Slow clients against the console under a real uvicorn (started as `runconsole` starts it, with short
timeouts): a client that holds a connection open without finishing its request's headers, or its body, is
hung up on (console.request_limits), and everyone else is still served meanwhile."""

import select
import socket
import time

import pytest

from console import services
from tests.conftest import RUN_ID, _worker_database_env
from tests.integration.helpers import TEST_OUTPUT

HEADER_SECONDS = 2
BODY_IDLE_SECONDS = 2
BODY_TOTAL_SECONDS = 5
# How late a hang-up may come on a busy machine; without the timeouts it never comes at all.
SLACK_SECONDS = 10
SLOW_CLIENTS = 200
PARTIAL_HEAD = b"GET /accounts/login/ HTTP/1.1\r\nHost: localhost\r\nUser-Agent: slow"


@pytest.fixture
def web_server(transactional_db):
    port = services.free_port()
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    env = {**_worker_database_env(), "REDIS_URL": f"redis://127.0.0.1:{services.free_port()}/0",
           "REQUEST_HEADER_TIMEOUT_SECONDS": str(HEADER_SECONDS),
           "REQUEST_BODY_IDLE_TIMEOUT_SECONDS": str(BODY_IDLE_SECONDS),
           "REQUEST_BODY_TIMEOUT_SECONDS": str(BODY_TOTAL_SECONDS)}
    process = services.start_web_server(port, env, TEST_OUTPUT / f"uvicorn-edge-slow-{RUN_ID}.log")
    yield port
    services.stop(process)


def connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.setblocking(False)
    return client


def hung_up(client: socket.socket, said: bytearray) -> bool:
    """Whether the server hung up; what it said meanwhile is added to `said`."""
    while True:
        try:
            data = client.recv(65536)
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True
        if not data:
            return True
        said += data


def trickle(clients: list[socket.socket], data: bytes) -> None:
    for client in clients:
        try:
            client.send(data)
        except OSError:
            pass  # hung up on already: found by hung_up()


def watch_until_hung_up(clients: dict[socket.socket, float], timeout: float, trickling: list[socket.socket],
                        probe_port: int | None = None) -> tuple[dict[socket.socket, float], dict[socket.socket, bytearray], list[float]]:
    """Send a byte every half second on the `trickling` clients, as a slowloris does, until the server has hung
    up on every client or `timeout` passed; meanwhile, with `probe_port`, time an ordinary request each round. Returns when
    each was hung up on (seconds after its start), what it was told, and the ordinary requests' seconds."""
    ended: dict[socket.socket, float] = {}
    told: dict[socket.socket, bytearray] = {client: bytearray() for client in clients}
    served: list[float] = []
    deadline = time.monotonic() + timeout
    while len(ended) < len(clients) and time.monotonic() < deadline:
        trickle([client for client in trickling if client not in ended], b"x")
        readable, _, _ = select.select([client for client in clients if client not in ended], [], [], 0.5)
        for client in readable:
            if hung_up(client, told[client]):
                ended[client] = time.monotonic() - clients[client]
        if probe_port is not None:
            served.append(ordinary_request_seconds(probe_port))
    return ended, told, served


def ordinary_request_seconds(port: int) -> float:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(b"GET /accounts/login/ HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    return time.monotonic() - started


@pytest.mark.attack(f"{SLOW_CLIENTS} connections that never finish their headers (silent, or a byte at a time)",
                    "each is hung up on after the header timeout; others are served meanwhile")
def test_clients_that_never_finish_their_headers_are_hung_up_on_after_the_header_timeout(web_server):
    port = web_server
    clients: dict[socket.socket, float] = {}
    for _ in range(SLOW_CLIENTS):
        client = connect(port)
        clients[client] = time.monotonic()
    silent = list(clients)[: SLOW_CLIENTS // 2]
    trickling = list(clients)[SLOW_CLIENTS // 2:]
    trickle(trickling, PARTIAL_HEAD)
    try:
        ended, told, served = watch_until_hung_up(clients, HEADER_SECONDS + SLACK_SECONDS, trickling, port)
        print(f"hung up on after {min(ended.values(), default=0):.2f} to {max(ended.values(), default=0):.2f} s; "
              f"ordinary requests meanwhile took at most {max(served, default=0):.2f} s")
        still_open = len(clients) - len(ended)
        assert not still_open, (f"{still_open} of {len(clients)} slow connections still open after "
                                f"{HEADER_SECONDS + SLACK_SECONDS} s (header timeout {HEADER_SECONDS} s)")
        for group in (silent, trickling):
            seconds = sorted(ended[client] for client in group)
            # Hung up on by the deadline, not by accident: not before it, whether the client sent bytes or not.
            assert seconds[0] >= HEADER_SECONDS - 0.5, seconds[:5]
        assert not [said for said in told.values() if said], "a request with unfinished headers was answered"
        assert served and max(served) < SLACK_SECONDS, served
    finally:
        for client in clients:
            client.close()


@pytest.mark.attack("a kept-alive connection that then sends its next request's headers a byte at a time",
                    "hung up on after the header timeout")
def test_a_kept_alive_connection_trickling_its_next_request_is_hung_up_on(web_server):
    port = web_server
    client = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        client.sendall(b"GET /accounts/login/ HTTP/1.1\r\nHost: localhost\r\n\r\n")
        first = b""
        while b"</html>" not in first:
            first += client.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        client.setblocking(False)
        started = time.monotonic()
        ended, _, _ = watch_until_hung_up({client: started}, HEADER_SECONDS + SLACK_SECONDS, [client])
        assert client in ended, f"still open after {HEADER_SECONDS + SLACK_SECONDS} s of a byte every half second"
    finally:
        client.close()


def body_head(length: int) -> bytes:
    return (f"POST /api/v1/training-jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


@pytest.mark.attack("request bodies that stall after a few bytes, or come a byte every half second",
                    "a 408 in the API's JSON shape after the body's pause or total timeout")
@pytest.mark.parametrize("pace", ["stalled", "trickled"])
def test_a_body_that_stalls_or_trickles_gets_a_408_after_its_timeout(web_server, pace):
    port = web_server
    clients: dict[socket.socket, float] = {}
    for _ in range(20):
        client = connect(port)
        client.send(body_head(100_000) + b'{"name": ')
        clients[client] = time.monotonic()
    timeout = BODY_IDLE_SECONDS if pace == "stalled" else BODY_TOTAL_SECONDS
    try:
        ended, told, _ = watch_until_hung_up(clients, timeout + SLACK_SECONDS,
                                             list(clients) if pace == "trickled" else [])
        print(f"{pace}: answered after {min(ended.values(), default=0):.2f} to {max(ended.values(), default=0):.2f} s")
        assert len(ended) == len(clients), (f"{len(clients) - len(ended)} of {len(clients)} slow bodies still open "
                                            f"after {timeout + SLACK_SECONDS} s")
        assert min(ended.values()) >= timeout - 0.5, sorted(ended.values())[:5]
        for said in told.values():
            assert said.startswith(b"HTTP/1.1 408 "), said[:200]
            assert b"content-type: application/json" in said.lower()
            assert b'{"detail": "The request body did not arrive in time' in said
    finally:
        for client in clients:
            client.close()
