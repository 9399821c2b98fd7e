"""The console's JSON API over the standard library's HTTP, with its errors turned into one-line messages."""

import http.client
import ipaddress
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import IO, Any

from . import __version__
from .config import Settings
from .errors import BadInput, CliError

API = "/api/v1"
TIMEOUT_SECONDS = 60
SUBMIT_ATTEMPTS = 3
# A 503 (the console's database busy: nothing was done) is sent again after its Retry-After, this many times in
# all, each wait at most BUSY_WAIT_MAX_SECONDS (BUSY_WAIT_SECONDS when the answer names none).
BUSY_ATTEMPTS = 4
BUSY_WAIT_SECONDS = 5
BUSY_WAIT_MAX_SECONDS = 30


class Unreachable(CliError):
    """The console did not answer (refused, reset, timed out): the request may be tried again."""


class Busy(CliError):
    """A 503: the console could not take the request just now and did nothing; `wait` seconds, it says."""

    def __init__(self, message: str, wait: float):
        super().__init__(message)
        self.wait = wait


def retry_after(value: str | None) -> float:
    """Retry-After's seconds (the console sends a number; a date or nothing gets the default), within bounds."""
    seconds = int(value) if value and value.strip().isdigit() else BUSY_WAIT_SECONDS
    return min(seconds, BUSY_WAIT_MAX_SECONDS)


def error_text(body: bytes, status: int) -> str:
    """The console's error object ({"detail": ...} or {"field": [messages]}) as one line."""
    try:
        data = json.loads(body)
    except ValueError:
        return f"HTTP {status}"
    if not isinstance(data, dict):
        return f"HTTP {status}: {data}"
    parts = []
    for field, messages in data.items():
        text = "; ".join(str(item) for item in messages) if isinstance(messages, list) else str(messages)
        parts.append(text if field == "detail" else f"{field}: {text}")
    return " | ".join(parts).replace("\n", " ") or f"HTTP {status}"


def origin_of(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    default_port = 443 if parts.scheme == "https" else 80
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or default_port


def is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ElsewhereRedirect(Exception):
    """The console sent a GET to another origin (a signed link to an object store)."""

    def __init__(self, url: str):
        super().__init__(url)
        self.url = url


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the configured console's origin (scheme, host and port): the token is
    a password, and urllib would send it on to whatever host a redirect names, or over plain HTTP."""

    def __init__(self, console_url: str):
        self.console_url = console_url

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if origin_of(newurl) != origin_of(self.console_url):
            fp.close()
            if getattr(req, "to_object_store", False) and newurl.startswith(("http://", "https://")):
                # A file kept in an object store: the caller fetches the signed link itself, without the token.
                raise ElsewhereRedirect(newurl)
            raise CliError(f"the console at {self.console_url} redirected to {newurl}, which is not the console; "
                           "the token was not sent there (set the console's own URL with `tc login --url`)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class Client:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.opener = urllib.request.build_opener(SameOriginRedirects(settings.url))
        _scheme, host, _port = origin_of(settings.url)
        if settings.url.startswith("http://") and not is_loopback(host):
            print(f"tc: warning: {settings.url} is plain HTTP: the token and the jobs' data cross the network "
                  "unencrypted; use the console's https:// address", file=sys.stderr)

    def url(self, path: str, query: dict | None = None) -> str:
        pairs = [(key, value) for key, value in (query or {}).items() if value is not None]
        expanded = [(key, item) for key, value in pairs for item in (value if isinstance(value, list) else [value])]
        suffix = f"?{urllib.parse.urlencode(expanded)}" if expanded else ""
        base = path if path.startswith("/") else f"{API}/{path}"
        return f"{self.settings.url}{base}{suffix}"

    def open(self, method: str, path: str, *, query: dict | None = None, body: bytes | IO[bytes] | None = None,
             headers: dict | None = None, timeout: float = TIMEOUT_SECONDS, to_object_store: bool = False):
        """The response, open; a refusal raises CliError (BadInput for the 4xx that mean the request was wrong).
        `to_object_store`: a redirect elsewhere raises ElsewhereRedirect (a file the console keeps in a store).

        A 503 is sent again after the wait it names, up to BUSY_ATTEMPTS times in all, saying so on stderr: the
        console answers it only when it did nothing (a stop or a submission not recorded). A streamed body
        cannot be sent twice: its 503 is said at once."""
        for attempt in range(1, BUSY_ATTEMPTS + 1):
            try:
                return self._open_once(method, path, query=query, body=body, headers=headers, timeout=timeout,
                                       to_object_store=to_object_store)
            except Busy as busy:
                if not (body is None or isinstance(body, bytes)):
                    raise CliError(f"{busy} (HTTP 503; the upload was not kept: send it again later)") from None
                if attempt == BUSY_ATTEMPTS:
                    raise CliError(f"{busy} (HTTP 503; sent {attempt} times, the console stayed busy: "
                                   "try again later)") from None
                print(f"tc: the console is busy (HTTP 503): sending it again in {busy.wait:g} s "
                      f"(attempt {attempt + 1} of {BUSY_ATTEMPTS})", file=sys.stderr)
                time.sleep(busy.wait)
        raise AssertionError("unreachable")

    def _open_once(self, method: str, path: str, *, query: dict | None, body: bytes | IO[bytes] | None,
                   headers: dict | None, timeout: float, to_object_store: bool):
        request = urllib.request.Request(self.url(path, query), data=body, method=method, headers={
            "Authorization": f"Token {self.settings.token}", "User-Agent": f"tc/{__version__}", **(headers or {})})
        request.to_object_store = to_object_store  # type: ignore[attr-defined]
        try:
            return self.opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as error:
            with error:
                message = error_text(error.read(), error.code)
            if error.code == 503:
                raise Busy(message, retry_after(error.headers.get("Retry-After"))) from None
            if error.code in (401, 403):
                raise CliError(f"{message} (HTTP {error.code}; check the token: `tc login`)") from None
            if 400 <= error.code < 500 and error.code != 429:
                raise BadInput(message) from None
            raise CliError(f"{message} (HTTP {error.code})") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise Unreachable(f"cannot reach the console at {self.settings.url}: {reason}") from None

    def json(self, method: str, path: str, *, query: dict | None = None, data: Any = None,
             headers: dict | None = None) -> Any:
        body = None if data is None else json.dumps(data).encode()
        headers = {"Accept": "application/json", **(headers or {})}
        if body is not None:
            headers["Content-Type"] = "application/json"
        with self.open(method, path, query=query, body=body, headers=headers) as response:
            try:
                raw = response.read()
            except (OSError, http.client.HTTPException) as error:
                raise Unreachable(f"the console's answer to {path} was cut off: {error}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise CliError(f"the console answered {path} with something that is not JSON") from None

    def get(self, path: str, **query) -> Any:
        return self.json("GET", path, query=query)

    def post(self, path: str, data: Any = None) -> Any:
        return self.json("POST", path, data=data if data is not None else {})

    def submit(self, body: dict) -> dict:
        """Submit a job; a connection lost before the answer is retried with the same Idempotency-Key, so the
        console creates the job once."""
        key = f"tc-{uuid.uuid4()}"
        for attempt in range(SUBMIT_ATTEMPTS):
            try:
                return self.json("POST", "training-jobs", data=body, headers={"Idempotency-Key": key})
            except Unreachable:
                if attempt == SUBMIT_ATTEMPTS - 1:
                    raise
                time.sleep(1 + attempt)
        raise AssertionError("unreachable")

    def pages(self, path: str, query: dict, limit: int | None) -> Iterator[dict]:
        """Every item of a paginated list (or the first `limit`), following the console's pages."""
        offset, given = 0, 0
        while True:
            page_size = min(1000, limit - given) if limit is not None else 1000
            page = self.get(path, **query, limit=page_size, offset=offset)
            for item in page["results"]:
                yield item
                given += 1
            offset += len(page["results"])
            if not page.get("next") or not page["results"] or (limit is not None and given >= limit):
                return

    def upload(self, path: str, fields: dict[str, str], file_field: str, file_name: str, file: IO[bytes]) -> Any:
        """A multipart/form-data POST, the file streamed from disk."""
        boundary = f"tc-{os.urandom(12).hex()}"
        head = b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
            for name, value in fields.items())
        head += (f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; filename="{file_name}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n").encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        size = os.fstat(file.fileno()).st_size
        stream = _Concatenated([head, file, tail])
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Accept": "application/json",
                   "Content-Length": str(len(head) + size + len(tail))}
        with self.open("POST", path, body=stream, headers=headers, timeout=max(TIMEOUT_SECONDS, 600)) as response:  # type: ignore[arg-type]
            return json.loads(response.read())

    def download(self, path: str, destination: IO[bytes]) -> None:
        """A file from the console, or from the object store the console sends its owner to (a signed link:
        fetched without the token, which is for the console alone)."""
        try:
            response = self.open("GET", path, to_object_store=True)
        except ElsewhereRedirect as redirect:
            try:
                response = urllib.request.urlopen(redirect.url, timeout=max(TIMEOUT_SECONDS, 600))
            except (urllib.error.URLError, OSError) as error:
                raise Unreachable(f"cannot fetch {path} from the object store: {getattr(error, 'reason', error)}") from None
        with response:
            while chunk := response.read(1 << 16):
                destination.write(chunk)


class _Concatenated:
    """Bytes, then a file, then bytes, read as one body (urllib sends a file-like body in blocks)."""

    def __init__(self, parts: list):
        self.parts = parts

    def read(self, size: int = -1) -> bytes:
        while self.parts:
            part = self.parts[0]
            if isinstance(part, bytes):
                if size < 0 or size >= len(part):
                    self.parts.pop(0)
                    return part
                self.parts[0] = part[size:]
                return part[:size]
            chunk = part.read(size if size > 0 else 1 << 16)
            if chunk:
                return chunk
            self.parts.pop(0)
        return b""
