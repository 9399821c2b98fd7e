"""Request-level guards that every page and API route shares.

- ContentSecurityPolicyMiddleware: the Content-Security-Policy header (settings.CONTENT_SECURITY_POLICY). The
  pages load their scripts and styles from /static/ only, with no inline script or style.
- ApiErrorsAsJsonMiddleware: under /api/, an error answered outside Django REST framework (an unknown route,
  a method a plain view refuses, Django's own 400/413/500 pages) becomes `{"detail": "..."}` like every
  other API error.
- RequestLimitsMiddleware: a query string holding a NUL is a 400 (no filter means one, and PostgreSQL cannot
  hold it in a query); a body declared larger than DATA_UPLOAD_MAX_MEMORY_SIZE is a 413 here too, for a
  console served without the ASGI edge. Under uvicorn, bodies are bounded before Django sees them, chunked
  ones counted as they come, with the upload route's own limit (console.request_limits).
- FailureCounter / client_address: failures per client address (bad API tokens) in the cache, for the
  API's authentication and the log stream. A lockout stops guessing from that address, not the people
  who share it: a token that has already authenticated from the address keeps working (the way a
  "device cookie" lets a known browser past a login lockout), only tokens it has not seen wait.

The client's address is REMOTE_ADDR: uvicorn takes X-Forwarded-For and X-Forwarded-Proto only from the
proxies listed in TRUSTED_PROXIES (none by default), so a client cannot choose the address it is counted as.
"""

import hashlib
import time

from django.conf import settings
from django.core.cache import cache
from django.http import HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin

API_PREFIX = "/api/"
# How long a token that authenticated from an address stays known there (renewed at each success).
KNOWN_TOKEN_SECONDS = 30 * 24 * 3600
# What an API error answered outside DRF says, by status; others say their reason phrase.
API_ERROR_DETAILS = {
    400: "Bad request.",
    401: "Authentication credentials were not provided.",
    403: "You do not have permission to perform this action.",
    404: "Not found.",
    413: "The request body is too large.",
    429: "Too many requests.",
    500: "Internal server error.",
}
# Headers an error keeps when its body is replaced.
KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate", "Vary")


def is_api(request) -> bool:
    return request.path_info.startswith(API_PREFIX)


def client_address(request) -> str:
    return request.META.get("REMOTE_ADDR") or "unknown"


def policy_with_inline_styles(policy: str) -> str:
    """The policy, letting the page apply inline styles: the terminal (xterm.js) draws its screen with style
    elements and attributes it makes as it goes, which no nonce or hash can name (xtermjs/xterm.js#4445). Scripts
    stay as strict; only a job page that may hold a terminal, for the job's owner, gets this."""
    directives = [part.strip() for part in policy.split(";") if part.strip()]
    names = [directive.partition(" ")[0].lower() for directive in directives]
    if "style-src" not in names:
        # Without its own, style-src is default-src: it gets default-src's sources, then the inline styles.
        default = next((directive.partition(" ")[2] for directive, name in zip(directives, names, strict=True)
                        if name == "default-src"), "")
        directives.append(f"style-src {default}".strip())
        names.append("style-src")
    for index, (directive, name) in enumerate(zip(directives, names, strict=True)):
        if name in ("style-src", "style-src-elem", "style-src-attr") and "'unsafe-inline'" not in directive.split():
            directives[index] = f"{directive} 'unsafe-inline'"
    return "; ".join(directives)


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    def process_response(self, request, response):
        policy = settings.CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response


class ApiErrorsAsJsonMiddleware(MiddlewareMixin):
    def process_response(self, request, response):
        if response.status_code < 400 or response.streaming or not is_api(request):
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        status = response.status_code
        if status == 405:
            detail = f'Method "{request.method}" not allowed.'
        else:
            detail = API_ERROR_DETAILS.get(status) or f"{response.reason_phrase}."
        answer = JsonResponse({"detail": detail}, status=status)
        for name in KEPT_HEADERS:
            if name in response:
                answer[name] = response[name]
        return answer


def _refusal(request, status: int, detail: str) -> HttpResponse:
    if is_api(request):
        return JsonResponse({"detail": detail}, status=status)
    return HttpResponse(detail, status=status, content_type="text/plain; charset=utf-8")


class RequestLimitsMiddleware(MiddlewareMixin):
    def process_request(self, request):
        query = request.META.get("QUERY_STRING", "")
        if "%00" in query or "\x00" in query:
            return _refusal(request, 400, "The query string holds a NUL character.")
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is None or request.content_type == "multipart/form-data":
            return None
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            return _refusal(request, 413, f"The request body is too large: at most {limit} bytes.")
        return None


class FailureCounter:
    """Failures per client address, counted in fixed windows in the cache.

    After `limit` failures within one window the address is refused until the window ends. The cache is
    Django's (per process by default, shared when CACHES points at Redis).
    """

    def __init__(self, name: str, limit_setting: str, window_setting: str):
        self.name, self.limit_setting, self.window_setting = name, limit_setting, window_setting

    @property
    def limit(self) -> int:
        return getattr(settings, self.limit_setting)

    @property
    def window(self) -> int:
        return getattr(settings, self.window_setting)

    def _keys(self, address: str) -> tuple[str, str]:
        key = f"console:{self.name}:{address}"
        return f"{key}:count", f"{key}:since"

    def _known_key(self, address: str, token: str) -> str:
        # A digest, never the token: the cache may be a Redis that others can read.
        digest = hashlib.sha256(token.encode()).hexdigest()
        return f"console:{self.name}:{address}:known:{digest}"

    def remember_success(self, address: str, token: str) -> None:
        """The token authenticated from this address: a later lockout of the address does not refuse it."""
        cache.set(self._known_key(address, token), 1, timeout=KNOWN_TOKEN_SECONDS)

    def record(self, address: str) -> None:
        count_key, since_key = self._keys(address)
        cache.add(since_key, time.time(), timeout=self.window)
        cache.add(count_key, 0, timeout=self.window)
        try:
            cache.incr(count_key)
        except ValueError:  # expired between add and incr: this failure opens a new window
            cache.set(count_key, 1, timeout=self.window)

    def seconds_refused(self, address: str, token: str = "") -> int:
        """0 when the address may try this token; otherwise how long it is still refused."""
        count_key, since_key = self._keys(address)
        values = cache.get_many([count_key, since_key])
        if values.get(count_key, 0) < self.limit:
            return 0
        if token and cache.get(self._known_key(address, token)):
            return 0
        since = values.get(since_key, time.time())
        return max(int(since + self.window - time.time()) + 1, 1)

    def clear(self, address: str) -> None:
        cache.delete_many(list(self._keys(address)))


token_failures = FailureCounter("api-token-failures", "API_TOKEN_FAILURE_LIMIT", "API_TOKEN_FAILURE_WINDOW_SECONDS")


def presents_token(request) -> bool:
    """Whether the request tries a token (`Token ...` or `Bearer ...`), well formed or not."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    return header.split(" ", 1)[0].lower() in ("token", "bearer")


def presented_token(request) -> str:
    """The token the request presents (empty when none): what a lockout looks up among the known ones."""
    scheme, _space, value = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return value.strip() if scheme.lower() in ("token", "bearer") else ""


def token_refusal_detail(seconds: int) -> str:
    return f"Too many failed token attempts from this address; try again in {seconds} s."
