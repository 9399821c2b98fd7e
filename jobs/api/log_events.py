"""The live log's HTTP side: GET /api/v1/training-jobs/<id>/log/events (Server-Sent Events), an async view
with the API's ways in (a token or the browser's session), its refusals in the API's error shape, and the
live streams each user may hold open. The stream itself is the log stage's (jobs.logs.follow)."""

import threading
import weakref
from collections import Counter
from collections.abc import Callable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.handlers.asgi import ASGIRequest
from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET

from console.security import client_address, presented_token, presents_token, token_failures, token_refusal_detail
from jobs.logs.follow import file_chunks, log_events
from jobs.logs.forms import LogQueryForm, event_cursor
from jobs.models import ApiToken
from jobs.submission.access import visible_jobs
from jobs.submission.forms import form_errors


def log_file_chunks(request, job_id: int, query: dict, through: int):
    """The log as a file, in the iterator the server the request came through wants (see file_chunks)."""
    return file_chunks(job_id, query, through, asynchronous=isinstance(getattr(request, "_request", request), ASGIRequest))


class StreamSlots:
    """The live log streams each user holds open in this process, at most settings.LOG_STREAMS_PER_USER."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: Counter[int] = Counter()

    def open_count(self, user_id: int) -> int:
        with self._lock:
            return self._open[user_id]

    def take(self, user_id: int, limit: int) -> Callable[[], None] | None:
        """A slot's release (safe to call more than once), or None when the user holds `limit` already."""
        with self._lock:
            if self._open[user_id] >= limit:
                return None
            self._open[user_id] += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._open[user_id] -= 1
                if self._open[user_id] <= 0:
                    del self._open[user_id]

        return release


stream_slots = StreamSlots()


def holding_slot(events, release: Callable[[], None]):
    """The event stream, giving its slot back when it ends, fails, is cancelled (the client went away) or,
    never started, is collected."""

    async def stream():
        try:
            async for part in events:
                yield part
        finally:
            release()
            await events.aclose()

    wrapped = stream()
    weakref.finalize(wrapped, release)
    return wrapped


async def request_user(request):
    """The API's two ways in, for an async view: a DRF token, or the browser's session."""
    if presents_token(request):
        return await sync_to_async(ApiToken.user_of)(presented_token(request))
    user = await request.auser()
    return user if user.is_authenticated else None


def _error(status: int, detail, **headers) -> JsonResponse:
    body = detail if isinstance(detail, dict) else {"detail": detail}
    response = JsonResponse(body, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


async def api_user(request):
    """The user an async API view serves, or the API's refusal. Bad tokens count against the client's address
    as in the rest of the API (a token already used from the address goes on working through a lockout)."""
    address, tried, token = client_address(request), presents_token(request), presented_token(request)
    if tried:
        wait = await sync_to_async(token_failures.seconds_refused)(address, token)
        if wait:
            return None, _error(429, token_refusal_detail(wait), Retry_After=str(wait))
    user = await request_user(request)
    if user is None:
        if tried:
            await sync_to_async(token_failures.record)(address)
            return None, _error(401, "Invalid token.", WWW_Authenticate="Token")
        return None, _error(401, "Authentication credentials were not provided.", WWW_Authenticate="Token")
    if tried:
        await sync_to_async(token_failures.remember_success)(address, token)
    return user, None


@require_GET
async def job_log_events(request, pk: int):
    """GET /api/v1/training-jobs/<id>/log/events (or /log with Accept: text/event-stream).

    Each user holds at most LOG_STREAMS_PER_USER streams open at once (the next is a 429).
    """
    user, refusal = await api_user(request)
    if refusal is not None:
        return refusal
    jobs = await sync_to_async(visible_jobs)(user)  # asks the database for the user's permissions
    job_id = await jobs.filter(pk=pk).values_list("pk", flat=True).afirst()
    if job_id is None:
        return _error(404, "No TrainingJob matches the given query.")
    form = LogQueryForm(request.GET)
    if not form.is_valid():
        return _error(400, form_errors(form))
    try:
        cursor = event_cursor(request.headers.get("Last-Event-ID"), form.cleaned_data["after"])
    except ValidationError as error:
        return _error(400, {"Last-Event-ID": error.messages})
    release = stream_slots.take(user.pk, settings.LOG_STREAMS_PER_USER)
    if release is None:
        return _error(429, f"{settings.LOG_STREAMS_PER_USER} live log streams are open already, the most one user "
                           "may hold: close one first.", Retry_After="5")
    response = StreamingHttpResponse(holding_slot(log_events(job_id, cursor, form.cleaned_data), release),
                                     content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
