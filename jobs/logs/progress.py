"""Job progress over Redis: one publisher for the run, and a waiter for followers that want to wake up on news.

Redis is the transport and the database is the record: a lost message costs a follower one poll,
never a line. So publishing fails fast and is swallowed, and after a failure the publisher stays quiet
for a moment rather than slow down the run that stores the log.
"""

import asyncio
import logging
import time
import weakref
from functools import lru_cache
from typing import Literal, TypedDict, cast

import redis
import redis.asyncio
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.typing import EncodableT, FieldT

logger = logging.getLogger(__name__)
STREAM_MAX_LENGTH = 1000
# After Redis failed, publishing is skipped this long: followers poll meanwhile.
QUIET_AFTER_FAILURE_SECONDS = 1.0
# A follower that hears nothing looks at the database anyway this often (Redis down, a message lost).
FOLLOWER_POLL_SECONDS = 0.5


def job_channel(job_id: int) -> str:
    return f"console:job:{job_id}"


@lru_cache(maxsize=1)
def _client() -> redis.Redis:
    # No retries: a publish that cannot happen at once is not worth delaying the log for.
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0))


def redis_connection() -> redis.Redis:
    """This process' Redis connection, for the few things besides progress that go through Redis (a lock)."""
    return _client()


_quiet_until = 0.0


class LogAppended(TypedDict):
    """Lines up to `last_seq` are stored (Redis stream fields are strings)."""

    kind: Literal["log"]
    last_seq: str


class StateChanged(TypedDict):
    kind: Literal["state"]
    status: str


ProgressMessage = LogAppended | StateChanged


class JobProgressPublisher:
    def __init__(self, job_id: int):
        self.job_id = job_id

    def _publish(self, fields: ProgressMessage) -> None:
        global _quiet_until
        if time.monotonic() < _quiet_until:
            return
        try:
            # A progress message's fields are all strings (see the TypedDicts), which a stream entry holds.
            entry = cast(dict[FieldT, EncodableT], dict(fields))
            _client().xadd(job_channel(self.job_id), entry, maxlen=STREAM_MAX_LENGTH, approximate=True)
        except redis.RedisError as error:
            _quiet_until = time.monotonic() + QUIET_AFTER_FAILURE_SECONDS
            logger.warning("job %s: progress not published (%s); followers will poll", self.job_id, error)

    def log_appended(self, last_seq: int) -> None:
        self._publish(LogAppended(kind="log", last_seq=str(last_seq)))

    def state_changed(self, status: str) -> None:
        self._publish(StateChanged(kind="state", status=status))


def publish_state_change(job_id: int, status: str, **_signal: object) -> None:
    """Wakes a job's live followers when its state changes (connected to jobs.models.job_state_changed)."""
    JobProgressPublisher(job_id).state_changed(status)


# redis.asyncio connections belong to the event loop that opened them.
_async_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis]" = weakref.WeakKeyDictionary()


def _async_client() -> redis.asyncio.Redis:
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = redis.asyncio.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=None, retry=AsyncRetry(NoBackoff(), 0)
        )
        _async_clients[loop] = client
    return client


class JobNews:
    """Waits for a job's progress messages. `since` is a stream id; "0-0" means "anything there is"."""

    def __init__(self, job_id: int):
        self.channel = job_channel(job_id)
        self.since = "0-0"

    async def start(self) -> None:
        """Remember where the stream is now, before the follower reads the database, so no news slips between."""
        try:
            latest = await _async_client().xrevrange(self.channel, count=1)
        except (redis.RedisError, OSError):
            return
        if latest:
            latest_id = latest[0][0]
            assert isinstance(latest_id, bytes), "the client does not decode responses: ids are bytes"
            self.since = latest_id.decode()

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - how long a follower waits between looks at the log
        """True when news came; False after `timeout` seconds, or a short pause when Redis cannot be reached."""
        try:
            answer = await _async_client().xread({self.channel: self.since}, block=max(int(timeout * 1000), 1), count=100)
        except (redis.RedisError, OSError):
            await asyncio.sleep(min(timeout, FOLLOWER_POLL_SECONDS))
            return False
        if not answer:
            return False
        # RESP2, the client's protocol, answers [[stream, [(id, fields), ...]]]; RESP3 would answer a dict.
        assert isinstance(answer, list), "the client speaks RESP2"
        self.since = answer[0][1][-1][0].decode()
        return True
