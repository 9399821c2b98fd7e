"""A terminal in a job's container: the channel between the web side (the page's terminal and `tc shell` talk
to the API) and the relay (jobs.runtime.shell, a task on the "shells" queue and the only side that holds SSH).

Redis is the transport, as for the rest of the console's news: what the user types (and a resize, or a close)
goes into a list the relay pops in order; what the terminal prints goes into a stream that each reader reads
from its last id, so a reader that reconnects (Last-Event-ID) misses nothing the stream still keeps. A session
is a hash with a lifetime that names its job, worker and user; its id is a random token, and the web side
also checks that the session is the asking user's own before it passes on a byte.
"""

import json
import secrets
import weakref
from asyncio import AbstractEventLoop, get_running_loop
from dataclasses import dataclass
from typing import Literal, TypedDict, cast

import redis
import redis.asyncio
from django.conf import settings

PREFIX = "console:shell"
# A session's keys outlive a relay that died without a word by this long, then Redis forgets them.
KEYS_LIFETIME_SECONDS = 24 * 3600
# The terminal's output kept for readers that come back: enough to redraw a screen or two.
OUTPUT_KEPT_ENTRIES = 2000
# What a user may have typed and the relay not yet taken (a paste of a few MB is refused, not queued).
INPUT_QUEUED_MAX = 256
INPUT_CHUNK_MAX_CHARS = 64 * 1024
TERMINAL_COLUMNS = (10, 500)
TERMINAL_ROWS = (4, 200)


@dataclass(frozen=True)
class ShellSession:
    id: str
    job_id: int
    worker_index: int
    user_id: int
    user_name: str
    columns: int
    rows: int


class InputMessage(TypedDict, total=False):
    kind: Literal["data", "resize", "close"]
    data: str
    columns: int
    rows: int


class OutputEntry(TypedDict):
    """One entry of the output stream: text the terminal printed, or its end and why."""

    id: str
    kind: Literal["output", "end"]
    text: str


class InputRefused(Exception):
    """The relay has not taken what was typed before: the user is asked to wait a moment."""


def _key(session_id: str, part: str) -> str:
    return f"{PREFIX}:{session_id}:{part}"


def _user_sessions_key(user_id: int) -> str:
    return f"{PREFIX}:user:{user_id}"


_client: redis.Redis | None = None


def sync_client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2,
                                       decode_responses=True)
    return _client


# redis.asyncio connections belong to the event loop that opened them (the web server's, or one relay's).
_async_clients: "weakref.WeakKeyDictionary[AbstractEventLoop, redis.asyncio.Redis]" = weakref.WeakKeyDictionary()


def async_client() -> redis.asyncio.Redis:
    loop = get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, decode_responses=True)
        _async_clients[loop] = client
    return client


async def close_async_client() -> None:
    """Close this loop's connection (a relay's loop ends with its session)."""
    client = _async_clients.pop(get_running_loop(), None)
    if client is not None:
        await client.aclose()


def _session_of(session_id: str, fields: dict[str, str]) -> ShellSession | None:
    try:
        return ShellSession(id=session_id, job_id=int(fields["job"]), worker_index=int(fields["worker"]),
                            user_id=int(fields["user"]), user_name=fields.get("user_name", ""),
                            columns=int(fields["columns"]), rows=int(fields["rows"]))
    except (KeyError, ValueError):
        return None


def open_session(job_id: int, worker_index: int, user_id: int, user_name: str, columns: int, rows: int) -> ShellSession:
    """A new session's record (the relay is queued by the caller once the record exists)."""
    session = ShellSession(id=secrets.token_urlsafe(24), job_id=job_id, worker_index=worker_index, user_id=user_id,
                           user_name=user_name, columns=columns, rows=rows)
    client = sync_client()
    with client.pipeline() as pipe:
        pipe.hset(_key(session.id, "meta"), mapping={
            "job": job_id, "worker": worker_index, "user": user_id, "user_name": user_name,
            "columns": columns, "rows": rows})
        pipe.expire(_key(session.id, "meta"), KEYS_LIFETIME_SECONDS)
        pipe.sadd(_user_sessions_key(user_id), session.id)
        pipe.expire(_user_sessions_key(user_id), KEYS_LIFETIME_SECONDS)
        pipe.execute()
    return session


def session(session_id: str) -> ShellSession | None:
    if not session_id or len(session_id) > 64:
        return None
    fields = cast(dict[str, str], sync_client().hgetall(_key(session_id, "meta")))
    return _session_of(session_id, fields)


def open_sessions_of(user_id: int) -> int:
    """How many of the user's sessions are still open (a session that ended leaves the user's set)."""
    client = sync_client()
    ids = cast(set[str], client.smembers(_user_sessions_key(user_id)))
    gone = [each for each in ids if not client.exists(_key(each, "meta")) or client.exists(_key(each, "ended"))]
    if gone:
        client.srem(_user_sessions_key(user_id), *gone)
    return len(ids) - len(gone)


def _push(session_id: str, message: InputMessage) -> None:
    client = sync_client()
    key = _key(session_id, "in")
    if client.llen(key) >= INPUT_QUEUED_MAX:
        raise InputRefused("the terminal has not taken what was typed before yet: try again in a moment")
    with client.pipeline() as pipe:
        pipe.rpush(key, json.dumps(message))
        pipe.expire(key, KEYS_LIFETIME_SECONDS)
        pipe.execute()


def send_input(session_id: str, data: str) -> None:
    _push(session_id, {"kind": "data", "data": data})


def send_resize(session_id: str, columns: int, rows: int) -> None:
    _push(session_id, {"kind": "resize", "columns": columns, "rows": rows})


def request_close(session_id: str) -> None:
    _push(session_id, {"kind": "close"})


# The relay's side (in its own event loop).

async def mark_started(session_id: str) -> None:
    """The relay took the session: a reader that sees no such mark for a while says no worker took it."""
    await async_client().set(_key(session_id, "started"), "1", ex=KEYS_LIFETIME_SECONDS)


async def next_input(session_id: str, wait_seconds: float) -> InputMessage | None:
    popped = await async_client().blpop([_key(session_id, "in")], timeout=wait_seconds)
    if popped is None:
        return None
    try:
        message = json.loads(popped[1])
    except ValueError:
        return None
    return cast(InputMessage, message) if isinstance(message, dict) else None


async def write_output(session_id: str, text: str) -> None:
    key = _key(session_id, "out")
    client = async_client()
    await client.xadd(key, {"kind": "output", "text": text}, maxlen=OUTPUT_KEPT_ENTRIES, approximate=True)
    await client.expire(key, KEYS_LIFETIME_SECONDS)


async def write_end(session_id: str, reason: str) -> None:
    client = async_client()
    await client.xadd(_key(session_id, "out"), {"kind": "end", "text": reason}, maxlen=OUTPUT_KEPT_ENTRIES,
                      approximate=True)
    await client.set(_key(session_id, "ended"), reason, ex=KEYS_LIFETIME_SECONDS)


# The web side's reader (in the web server's event loop).

async def read_output(session_id: str, after: str, wait_seconds: float) -> list[OutputEntry]:
    """The entries after `after` (a stream id, "0" for all that is kept), waiting up to wait_seconds for one."""
    found = await async_client().xread({_key(session_id, "out"): after}, count=200,
                                       block=max(int(wait_seconds * 1000), 1))
    entries: list[OutputEntry] = []
    for _stream, items in cast(list[tuple[str, list[tuple[str, dict[str, str]]]]], found or []):
        for entry_id, fields in items:
            kind: Literal["output", "end"] = "end" if fields.get("kind") == "end" else "output"
            entries.append({"id": entry_id, "kind": kind, "text": fields.get("text", "")})
    return entries


async def was_started(session_id: str) -> bool:
    return bool(await async_client().exists(_key(session_id, "started")))


def valid_stream_id(text: str) -> bool:
    first, dash, second = text.partition("-")
    return first.isascii() and first.isdigit() and (not dash or (second.isascii() and second.isdigit()))
