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
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TypeVar

from asgiref.sync import sync_to_async

from jobs.logs.progress import JobNews
from jobs.logs.store import StoredLogLine, read_after, rendered_chunk
from jobs.models import FINAL_STATES, LogLine, TrainingJob

# The lines of a follower's turn: a turn's own cost (the hop to its thread, the job's row, the query, the
# sends) is spread over as many lines. A page of lines of LOG_LINE_MAX_BYTES each is 32 MB before its JSON
# escapes, and one page of one stream is read at a time (READ_TURNS).
EVENT_BATCH_LINES = 2000
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


# The C encoder json.dumps(ensure_ascii=False) writes a string with: the same text, quotes included.
_json_string = json.encoder.encode_basestring


def _line_events(lines: list[StoredLogLine]) -> list[str]:
    """Each line's `message` event, the very text of _event(None, line_payload(line), line.seq), written
    without a dict and a json.dumps a line: a live follower writes every line of a flood, and those were
    two thirds of its time. A page's lines share a handful of times, each written once."""
    stamps: dict[datetime, str] = {}
    return [f'id: {seq}\ndata: {{"seq": {seq}, "worker": {"null" if worker is None else worker}, '
            f'"rank": {"null" if rank is None else rank}, '
            f'"stream": {_json_string(stream)}, "text": {_json_string(text)}, '
            f'"at": {stamps[at] if at in stamps else stamps.setdefault(at, _json_string(at.isoformat()))}}}\n\n'
            for seq, worker, rank, stream, text, at in lines]


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
    parts += _line_events(page.lines)
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


def file_chunks(job_id: int, query: dict, through: int, asynchronous: bool):
    """The log as the reference platform's files hold it, up to line `through`, a few thousand lines at a time:
    an async iterator for the ASGI server, a plain one for WSGI (Django consumes a whole iterator of the
    other kind before sending it)."""
    return _async_file_chunks(job_id, query, through) if asynchronous else _file_chunks(job_id, query, through)


def _file_chunks(job_id: int, query: dict, through: int):
    after: int | None = 0
    while after is not None:
        text, after = rendered_chunk(job_id, query, after, through)
        if after is None:
            return
        yield text.encode("utf-8")


async def _async_file_chunks(job_id: int, query: dict, through: int):
    after: int | None = 0
    while after is not None:
        chunk: tuple[str, int | None] = await in_turn(partial(rendered_chunk, job_id, query, after, through),
                                                      lambda chunk: chunk[1] is not None)
        text, after = chunk
        if after is None:
            return
        yield text.encode("utf-8")
