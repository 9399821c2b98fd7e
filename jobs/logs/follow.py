"""Following a job's log live (Server-Sent Events) and streaming it as a file, without a busy thread per reader.

Under the ASGI server both are async generators run by its event loop; each database read is one
short call into a thread. The database is the record: a follower reads the lines after its cursor, and
sleeps on the job's Redis stream (JobNews) until there is news, or looks anyway after a while, so a
lost message or a Redis restart costs it a little latency and never a line. Each line's event id is
its sequence number; a reconnecting browser sends it back as Last-Event-ID and resumes right after.

A follower's turn (reading a batch and writing it as events, in its thread) is CPU-bound Python, and a
flooded log keeps every follower busy with turn after turn. Twenty such threads at once hold the GIL so
long that every other request's thread waits seconds for each of its own turns: the pages and the API
stop answering. So the log streams of a web process (live followers and downloads) take their turns
READ_TURNS at a time, first come first served, and one that has more to read at once keeps its turn as
long again, idle: log streams take at most half of the process' time, whatever the logs and their readers.
The event loop only hands the text on.
"""

import asyncio
import json
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.handlers.asgi import ASGIRequest
from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET

from console.security import client_address, presents_token, token_failures, token_refusal_detail
from jobs.access import visible_jobs
from jobs.forms import form_errors
from jobs.logs.forms import LogQueryForm, event_cursor
from jobs.logs.progress import JobNews
from jobs.logs.store import StoredLogLine, read_after, rendered_chunk
from jobs.models import FINAL_STATES, ApiToken, LogLine, TrainingJob

EVENT_BATCH_LINES = 1000
# A comment this often keeps proxies from closing a quiet stream; it is also how long a follower
# sleeps on Redis before it looks at the database anyway.
KEEPALIVE_SECONDS = 15.0
RECONNECT_MILLISECONDS = 1000
# How many log streams of one web process read and encode a batch at once (see the module's docstring).
READ_TURNS = 1
Read = TypeVar("Read")


def line_payload(line: LogLine | StoredLogLine) -> dict:
    return {"seq": line.seq, "worker": line.worker_index, "rank": line.rank, "stream": line.stream,
            "text": line.text, "at": line.at.isoformat()}


def _event(kind: str | None, data: dict, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    head += f"event: {kind}\n" if kind else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _read(job_id: int, cursor: int, query: dict):
    """The job's state, then the lines after the cursor: lines stored before the state was read are all seen."""
    job = TrainingJob.objects.filter(pk=job_id).values("status", "log_line_count", "log_lines_dropped").get()
    page = read_after(job_id, cursor, query, EVENT_BATCH_LINES, total=job["log_line_count"])
    return job, page


@dataclass(frozen=True)
class EventBatch:
    text: str  # the events to send, "" for none
    cursor: int
    status: str
    more: bool  # stored lines lie beyond the cursor already


def _next_batch(job_id: int, cursor: int, query: dict, sent_status: str | None) -> EventBatch:
    """The events after the cursor, written out in the follower's thread (not on the event loop)."""
    job, page = _read(job_id, cursor, query)
    parts = []
    if job["status"] != sent_status:
        parts.append(_event("status", {"status": job["status"], "total": job["log_line_count"],
                                       "dropped": job["log_lines_dropped"]}))
    parts += [_event(None, line_payload(line), line.seq) for line in page.lines]
    if page.next != cursor and (not page.lines or page.lines[-1].seq != page.next):
        parts.append(_event("cursor", {"next": page.next}, page.next))
    return EventBatch("".join(parts), page.next, job["status"], page.more)


# An asyncio semaphore belongs to the event loop it first waited in: one per loop.
_read_turns: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = weakref.WeakKeyDictionary()


def read_turn() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    turns = _read_turns.get(loop)
    if turns is None:
        turns = _read_turns[loop] = asyncio.Semaphore(READ_TURNS)
    return turns


async def in_turn(read: Callable[[], Read], more: Callable[[Read], bool]) -> Read:
    """`read()` in the request's thread, in its turn among the process' log streams; when `more(result)` says
    there is more to read at once, the turn is held as long again, idle (see the module's docstring)."""
    async with read_turn():
        started = time.monotonic()
        result = await sync_to_async(read)()
        if more(result):
            await asyncio.sleep(time.monotonic() - started)
    return result


async def log_events(job_id: int, cursor: int, query: dict):
    """The event stream: `message` per line (id = seq), `cursor` when filtered-out lines moved the cursor,
    `status` when the job's state changes, `end` once the job is over and every line was sent."""
    news = JobNews(job_id)
    await news.start()
    yield f"retry: {RECONNECT_MILLISECONDS}\n\n"
    sent_status, last_sent = None, time.monotonic()
    while True:
        batch = await in_turn(partial(_next_batch, job_id, cursor, query, sent_status), lambda batch: batch.more)
        cursor, sent_status = batch.cursor, batch.status
        if batch.text:
            yield batch.text
            last_sent = time.monotonic()
        if batch.more:
            continue
        if batch.status in FINAL_STATES:
            yield _event("end", {"status": batch.status, "next": cursor})
            return
        if not await news.wait(KEEPALIVE_SECONDS) and time.monotonic() - last_sent >= KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            last_sent = time.monotonic()


def log_file_chunks(request, job_id: int, query: dict, through: int):
    """The log as the reference platform's files hold it, up to line `through`, a few thousand lines at a time.

    Django consumes a whole iterator of the other kind before sending it (an async one under WSGI, a
    sync one under ASGI), so the kind follows the server the request came through.
    """
    if isinstance(getattr(request, "_request", request), ASGIRequest):
        return _async_file_chunks(job_id, query, through)
    return _file_chunks(job_id, query, through)


class StreamSlots:
    """The live log streams each user holds open in this process, at most settings.LOG_STREAMS_PER_USER."""

    def __init__(self):
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


def _file_chunks(job_id: int, query: dict, through: int):
    after = 0
    while True:
        text, after = rendered_chunk(job_id, query, after, through)
        if after is None:
            return
        yield text.encode("utf-8")


async def _async_file_chunks(job_id: int, query: dict, through: int):
    after = 0
    while True:
        text, after = await in_turn(partial(rendered_chunk, job_id, query, after, through),
                                    lambda chunk: chunk[1] is not None)
        if after is None:
            return
        yield text.encode("utf-8")


async def request_user(request):
    """The API's two ways in, for an async view: a DRF token, or the browser's session."""
    header = request.headers.get("Authorization", "")
    for keyword in ("Token ", "Bearer "):
        if header.startswith(keyword):
            return await sync_to_async(ApiToken.user_of)(header[len(keyword):])
    user = await request.auser()
    return user if user.is_authenticated else None


def _error(status: int, detail, **headers) -> JsonResponse:
    body = detail if isinstance(detail, dict) else {"detail": detail}
    response = JsonResponse(body, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


@require_GET
async def job_log_events(request, pk: int):
    """GET /api/v1/training-jobs/<id>/log/events (or /log with Accept: text/event-stream).

    Bad tokens count against the client's address as in the rest of the API; each user holds at most
    LOG_STREAMS_PER_USER streams open at once (the next is a 429).
    """
    address, token_tried = client_address(request), presents_token(request)
    if token_tried:
        wait = await sync_to_async(token_failures.seconds_refused)(address)
        if wait:
            return _error(429, token_refusal_detail(wait), Retry_After=str(wait))
    user = await request_user(request)
    if user is None:
        if token_tried:
            await sync_to_async(token_failures.record)(address)
            return _error(401, "Invalid token.", WWW_Authenticate="Token")
        return _error(401, "Authentication credentials were not provided.", WWW_Authenticate="Token")
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
