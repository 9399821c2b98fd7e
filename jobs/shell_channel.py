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
from urllib.parse import urlparse

import redis
import redis.asyncio
from django.conf import settings

PREFIX = "console:shell"
# A session's record lives as long as its relay renews it (every few seconds): a relay that died without a
# word, or one that never started, frees the user's place within this long.
LEASE_SECONDS = 120
# What is left of a session once it ended (its output for a reader that comes back to it), then Redis forgets it.
ENDED_KEPT_SECONDS = 600
# The user's set of sessions (pruned at each open) and an ended session's keys expire on their own.
KEYS_LIFETIME_SECONDS = 24 * 3600
# The terminal's output kept for readers that come back: enough to redraw a screen or two (each entry at most
# runtime.shell.READ_CHUNK characters).
OUTPUT_KEPT_ENTRIES = 1000
# What a user may have typed and the relay not yet taken: a few MB at most a session (a paste is sent in parts).
INPUT_QUEUED_MAX = 64
INPUT_CHUNK_MAX_CHARS = 16 * 1024
INPUT_ENTRY_MAX_BYTES = 4 * INPUT_CHUNK_MAX_CHARS + 256
TERMINAL_COLUMNS = (10, 500)
TERMINAL_ROWS = (4, 200)
# The web process' readers of terminals each hold a connection while they wait (a blocking XREAD).
ASYNC_CONNECTIONS_MAX = 1000
READ_BLOCK_SECONDS_MAX = 20

# Count the user's open sessions (pruning those gone or ended) and add this one, at once: two opens at the same
# moment cannot both take the last place. KEYS: the user's set; ARGV: the most, the new id, the key prefix, the
# set's lifetime.
RESERVE_SCRIPT = """
local open = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', ARGV[3] .. id .. ':meta') == 1 and redis.call('EXISTS', ARGV[3] .. id .. ':ended') == 0 then
    open = open + 1
  else
    redis.call('SREM', KEYS[1], id)
  end
end
if open >= tonumber(ARGV[1]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


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


class SessionOver(Exception):
    """The session ended (or never started): nothing more goes to it."""


class TooManySessions(Exception):
    """The user holds the most sessions already."""


def _key(session_id: str, part: str) -> str:
    return f"{PREFIX}:{session_id}:{part}"


def _user_sessions_key(user_id: int) -> str:
    return f"{PREFIX}:user:{user_id}"


# This process' connections, by Redis URL (the settings may name another Redis later: a test's, a restart's).
_clients: dict[str, redis.Redis] = {}


def sync_client() -> redis.Redis:
    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2, decode_responses=True)
    return _clients[url]


# redis.asyncio connections belong to the event loop that opened them (the web server's, or one relay's).
_async_clients: "weakref.WeakKeyDictionary[AbstractEventLoop, redis.asyncio.Redis]" = weakref.WeakKeyDictionary()


def async_client() -> redis.asyncio.Redis:
    loop = get_running_loop()
    client = _async_clients.get(loop)
    if client is None or client.connection_pool.connection_kwargs.get("port") != _port_of(settings.REDIS_URL):
        # A reader blocks up to READ_BLOCK_SECONDS_MAX in one XREAD: the socket waits longer than that (redis-py's
        # default of 5 s would end a quiet terminal's stream as if Redis were gone).
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, decode_responses=True,
                                              socket_timeout=READ_BLOCK_SECONDS_MAX + 10,
                                              max_connections=ASYNC_CONNECTIONS_MAX)
        _async_clients[loop] = client
    return client


def _port_of(url: str) -> int:
    return urlparse(url).port or 6379


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


def open_session(job_id: int, worker_index: int, user_id: int, user_name: str, columns: int, rows: int,
                 most: int) -> ShellSession:
    """A new session's record, within the user's `most` open sessions (TooManySessions); the caller queues its
    relay, and forgets the session (forget) when it cannot."""
    session = ShellSession(id=secrets.token_urlsafe(24), job_id=job_id, worker_index=worker_index, user_id=user_id,
                           user_name=user_name, columns=columns, rows=rows)
    client = sync_client()
    # Until a relay takes it and renews it, the record lasts as long as a reader waits for one (and a little).
    client.hset(_key(session.id, "meta"), mapping={
        "job": job_id, "worker": worker_index, "user": user_id, "user_name": user_name,
        "columns": columns, "rows": rows})
    client.expire(_key(session.id, "meta"), settings.SHELL_START_SECONDS + 30)
    reserved = client.eval(RESERVE_SCRIPT, 1, _user_sessions_key(user_id), most, session.id, f"{PREFIX}:",
                           KEYS_LIFETIME_SECONDS)
    if not reserved:
        client.delete(_key(session.id, "meta"))
        raise TooManySessions(most)
    return session


def open_sessions_of(user_id: int) -> int:
    """How many of the user's sessions are open (recorded, not ended)."""
    client = sync_client()
    return sum(1 for each in cast(set[str], client.smembers(_user_sessions_key(user_id)))
               if client.exists(_key(each, "meta")) and not client.exists(_key(each, "ended")))


def forget(session: ShellSession) -> None:
    """A session whose relay could not be queued: it never was, and takes no place of its user's."""
    client = sync_client()
    client.delete(_key(session.id, "meta"))
    client.srem(_user_sessions_key(session.user_id), session.id)


def session(session_id: str) -> ShellSession | None:
    if not session_id or len(session_id) > 64:
        return None
    fields = cast(dict[str, str], sync_client().hgetall(_key(session_id, "meta")))
    return _session_of(session_id, fields)


def _push(session_id: str, message: InputMessage) -> None:
    client = sync_client()
    key = _key(session_id, "in")
    entry = json.dumps(message, ensure_ascii=False)
    if len(entry.encode()) > INPUT_ENTRY_MAX_BYTES:
        raise InputRefused("send what was typed in smaller parts")
    if client.exists(_key(session_id, "ended")) or not client.exists(_key(session_id, "meta")):
        raise SessionOver("the terminal has closed")
    if client.llen(key) >= INPUT_QUEUED_MAX:
        raise InputRefused("the terminal has not taken what was typed before yet: try again in a moment")
    with client.pipeline() as pipe:
        pipe.rpush(key, entry)
        pipe.expire(key, LEASE_SECONDS)
        pipe.execute()


def send_input(session_id: str, data: str) -> None:
    _push(session_id, {"kind": "data", "data": data})


def send_resize(session_id: str, columns: int, rows: int) -> None:
    _push(session_id, {"kind": "resize", "columns": columns, "rows": rows})


def request_close(session_id: str) -> None:
    _push(session_id, {"kind": "close"})


# The relay's side (in its own event loop).

async def mark_started(session_id: str) -> bool:
    """The relay took the session: a reader that sees no such mark for a while says no worker took it. False
    when the session is already over (a reader gave up waiting, or it expired): the relay then opens nothing."""
    client = async_client()
    if await client.exists(_key(session_id, "ended")) or not await client.exists(_key(session_id, "meta")):
        return False
    await client.set(_key(session_id, "started"), "1", ex=LEASE_SECONDS)
    await renew(session_id)
    return True


async def renew(session_id: str) -> None:
    """The relay is alive: the session's record and marks last another LEASE_SECONDS."""
    client = async_client()
    for part in ("meta", "started", "in"):
        await client.expire(_key(session_id, part), LEASE_SECONDS)


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
    await client.expire(key, LEASE_SECONDS)


async def write_end(session_id: str, reason: str) -> None:
    """The session is over: its reader is told why, and what is left of it expires soon."""
    client = async_client()
    await client.xadd(_key(session_id, "out"), {"kind": "end", "text": reason}, maxlen=OUTPUT_KEPT_ENTRIES,
                      approximate=True)
    await client.set(_key(session_id, "ended"), reason, ex=ENDED_KEPT_SECONDS)
    for part in ("meta", "started", "out"):
        await client.expire(_key(session_id, part), ENDED_KEPT_SECONDS)
    await client.delete(_key(session_id, "in"))


# The web side's reader (in the web server's event loop).

async def read_output(session_id: str, after: str, wait_seconds: float) -> list[OutputEntry]:
    """The entries after `after` (a stream id, "0" for all that is kept), waiting up to wait_seconds for one."""
    wait_seconds = min(wait_seconds, READ_BLOCK_SECONDS_MAX)
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


async def is_gone(session_id: str) -> bool:
    """The session's record expired: its relay stopped renewing it without a word (a worker killed)."""
    return not await async_client().exists(_key(session_id, "meta"))


def valid_stream_id(text: str) -> bool:
    """A Redis stream id: a millisecond time and a sequence, each a 64-bit unsigned number (Redis refuses more,
    and would end the stream)."""
    first, dash, second = text.partition("-")

    def number(part: str) -> bool:
        return part.isascii() and part.isdigit() and len(part) <= 20 and int(part) < 2**64

    return number(first) and (not dash or number(second))
