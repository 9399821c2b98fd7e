"""The one publisher of job progress to Redis, for followers that want to wake up on news.

Redis is the transport and the database is the record: a lost message costs a follower one poll,
never a line, so publishing failures are logged and swallowed.
"""

import logging
from functools import lru_cache

import redis
from django.conf import settings

logger = logging.getLogger(__name__)
STREAM_MAX_LENGTH = 1000


def job_channel(job_id: int) -> str:
    return f"console:job:{job_id}"


@lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


class JobProgressPublisher:
    def __init__(self, job_id: int):
        self.job_id = job_id

    def _publish(self, fields: dict[str, str]) -> None:
        try:
            _client().xadd(job_channel(self.job_id), fields, maxlen=STREAM_MAX_LENGTH, approximate=True)
        except redis.RedisError as error:
            logger.warning("job %s: progress not published (%s); followers will poll", self.job_id, error)

    def log_appended(self, last_seq: int) -> None:
        self._publish({"kind": "log", "last_seq": str(last_seq)})

    def state_changed(self, status: str) -> None:
        self._publish({"kind": "state", "status": status})
