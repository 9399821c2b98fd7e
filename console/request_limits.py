"""The web server's edge: how much a client may send, and how slowly, before Django sees its request.

Django's ASGI handler reads a request's whole body into a temporary file (on disk past
FILE_UPLOAD_MAX_MEMORY_SIZE) before any middleware or view may look at it, and uvicorn's h11 protocol
waits as long as a client likes for a request's headers. So, in front of both:

- BodyLimits, an ASGI middleware around the application (console/asgi.py). A body declared larger than
  its route takes is refused (413) before a byte of it is read; a body sent without a length (chunked) is
  counted as it arrives and refused as soon as the count passes the limit, so no more than the limit is
  ever read. The code-directory upload may be CODE_DIR_MAX_UPLOAD_BYTES (and its form fields); any other
  route DATA_UPLOAD_MAX_MEMORY_SIZE (no other route takes files). A client that pauses more than
  REQUEST_BODY_IDLE_TIMEOUT_SECONDS between two parts of its body, or sends it for longer than
  REQUEST_BODY_TIMEOUT_SECONDS in all (CODE_DIR_UPLOAD_TIMEOUT_SECONDS for the upload), gets a 408.
  API routes answer in the API's error shape, pages in plain text; the connection is closed after.
- HeaderDeadlineH11Protocol, uvicorn's h11 protocol with a deadline on each request's headers:
  REQUEST_HEADER_TIMEOUT_SECONDS from the connection's opening, or from the first byte of the next
  request on a kept-alive connection. A client that sends nothing, or its headers a byte at a time, is
  hung up on, instead of holding a socket for as long as it likes.
"""

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import h11
from asgiref.typing import (
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPScope,
    Scope,
)
from django.conf import settings
from django.urls import Resolver404, resolve
from uvicorn.protocols.http.h11_impl import H11Protocol

API_PREFIX = "/api/"


@dataclass(frozen=True)
class Refusal:
    status: int
    body: bytes
    content_type: bytes


def _refusal(status: int, is_api: bool, detail: str, field: str | None = None) -> Refusal:
    if not is_api:
        return Refusal(status, detail.encode(), b"text/plain; charset=utf-8")
    # The API's error shape (jobs.api.errors): keyed by the field to fix, or `detail` for the request as a whole.
    answer: dict[str, Any] = {field: [detail]} if field else {"detail": detail}
    return Refusal(status, json.dumps(answer).encode(), b"application/json")


@dataclass(frozen=True)
class BodyRules:
    """What one request's body may be: at most `max_bytes` (None: no limit), sent within the timeouts."""

    max_bytes: int | None
    total_seconds: float
    idle_seconds: float
    too_large: Refusal
    too_slow: Refusal


class BodyLimits:
    """The ASGI application, behind the body limits of the module's docstring. `upload_route` names the
    route (its URL pattern's name) that takes code-directory archives; `upload_allowance` is what its
    form fields may add to the archive."""

    def __init__(self, app: Any, upload_route: str, upload_allowance: int):
        self.app, self.upload_route, self.upload_allowance = app, upload_route, upload_allowance

    def rules(self, scope: HTTPScope) -> BodyRules:
        path = scope["path"]
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root):]
        is_api = path.startswith(API_PREFIX)
        idle = float(settings.REQUEST_BODY_IDLE_TIMEOUT_SECONDS)
        if is_api and scope["method"] == "POST" and self._is_upload(path):
            limit = settings.CODE_DIR_MAX_UPLOAD_BYTES
            return BodyRules(
                limit + self.upload_allowance, float(settings.CODE_DIR_UPLOAD_TIMEOUT_SECONDS), idle,
                _refusal(413, True, f"the upload is larger than {limit} bytes, the most that may be uploaded",
                         field="archive"),
                _refusal(408, True, "the upload came too slowly; send it again", field="archive"))
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        total = float(settings.REQUEST_BODY_TIMEOUT_SECONDS)
        return BodyRules(limit, total, idle,
                         _refusal(413, is_api, f"The request body is too large: at most {limit} bytes."),
                         _refusal(408, is_api, f"The request body did not arrive in time (pauses of at most "
                                               f"{idle:g} s, {total:g} s in all)."))

    def _is_upload(self, path: str) -> bool:
        try:
            return resolve(path).url_name == self.upload_route
        except Resolver404:
            return False

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rules = self.rules(scope)
        declared = declared_length(scope)
        if rules.max_bytes is not None and declared is not None and declared > rules.max_bytes:
            # Refused on its word: not a byte of the body is read (a client waiting for 100-continue sends none).
            await answer(send, rules.too_large)
            return
        body = BodyGuard(receive, rules)
        started = False

        async def watched_send(message: ASGISendEvent) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, body.receive, watched_send)
        # The application was told the client went away (Django gives up quietly); the client is told why.
        if body.refusal is not None and not started:
            await answer(send, body.refusal)


def declared_length(scope: HTTPScope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses such a request before it gets here
    return None


class BodyGuard:
    """The request's `receive`, counting the body's bytes and timing its parts. Past a limit it stops
    reading, notes the refusal and says the client disconnected; once the body is whole it steps aside
    (Django then listens for a disconnect for as long as the response lasts)."""

    def __init__(self, receive: ASGIReceiveCallable, rules: BodyRules):
        self._receive, self.rules = receive, rules
        self.deadline = asyncio.get_running_loop().time() + rules.total_seconds
        self.received = 0
        self.complete = False
        self.refusal: Refusal | None = None

    async def receive(self) -> ASGIReceiveEvent:
        if self.complete:
            return await self._receive()
        if self.refusal is not None:
            return {"type": "http.disconnect"}
        wait = min(self.rules.idle_seconds, self.deadline - asyncio.get_running_loop().time())
        try:
            async with asyncio.timeout(max(wait, 0)):
                message = await self._receive()
        except TimeoutError:
            self.refusal = self.rules.too_slow
            return {"type": "http.disconnect"}
        if message["type"] != "http.request":
            return message
        self.received += len(message.get("body", b""))
        if self.rules.max_bytes is not None and self.received > self.rules.max_bytes:
            self.refusal = self.rules.too_large
            return {"type": "http.disconnect"}
        self.complete = not message.get("more_body", False)
        return message


async def answer(send: ASGISendCallable, refusal: Refusal) -> None:
    # Connection: close, so the server hangs up after the answer instead of reading the rest of the body.
    await send({"type": "http.response.start", "status": refusal.status, "trailers": False, "headers": [
        (b"content-type", refusal.content_type), (b"content-length", str(len(refusal.body)).encode()),
        (b"x-content-type-options", b"nosniff"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": refusal.body, "more_body": False})


class HeaderDeadlineH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol (h11), hanging up on a client whose request's headers are not whole
    REQUEST_HEADER_TIMEOUT_SECONDS after the connection opened, or after the first byte of its next request."""

    header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        if self.header_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm_header_deadline()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_header_deadline()  # the headers are whole (or the request was refused)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self.header_deadline = self.loop.call_later(settings.REQUEST_HEADER_TIMEOUT_SECONDS, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def _headers_too_slow(self) -> None:
        self.header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()
