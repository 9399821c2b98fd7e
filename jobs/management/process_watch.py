"""`runconsole`'s watch over its Celery processes: a beat or a worker that hangs is killed and started again.

Every few seconds it pings the workers (Celery's remote control: a SIGSTOPped or stuck worker answers nothing),
reads when beat's heartbeat last ran (jobs.tasks.beat_heartbeat) and asks console.liveness which are silent past
HUNG_PROCESS_SECONDS. What it sees and each restart go to ConsoleProcess, which the capacity page and the node
admin show.
"""

import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime

import redis
from django.conf import settings
from django.db import close_old_connections, connection

from console import liveness
from console.celery import app
from console.supervisor import Child, Supervisor
from jobs.models import ConsoleProcess

Role = ConsoleProcess.Role
# The queue whose worker runs beat's heartbeat (the default queue, console/settings.py).
BEAT_CARRIER = Role.CONTROL_WORKER
PING_TIMEOUT_SECONDS = 1.0


def worker_hostname(role: str) -> str:
    """The name `runconsole` gives the worker of a queue (services.start_celery_worker: `<queue>@%h`)."""
    return f"{role.removeprefix('worker-')}@{socket.gethostname()}"


def wall(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


class ProcessWatch:
    def __init__(self, supervisor: Supervisor, beat: Child, workers: dict[str, Child],
                 say: Callable[[str], None], limit: float | None = None):
        self.supervisor, self.beat, self.workers, self.say = supervisor, beat, workers, say
        self.limit = float(settings.HUNG_PROCESS_SECONDS if limit is None else limit)
        self.every = liveness.heartbeat_seconds(self.limit)
        self.next_look = 0.0
        self.broker_since: float | None = None
        self.answered: dict[str, float] = {}
        self.broker = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2, socket_connect_timeout=2)
        self.failing = False

    def poll(self) -> None:
        """Look once its time has come; call this from the supervisor's loop."""
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + self.every
        # A long-lived process: a database connection that broke (a restarted PostgreSQL) is dropped before a
        # look and after a failed one, so the next look opens a fresh one instead of failing for ever.
        close_old_connections()
        try:
            self.look(time.time())
            self.failing = False
        except Exception as error:  # noqa: BLE001 - the watch must not take the supervisor down
            if not self.failing:  # said once, not every few seconds while it lasts
                self.say(f"the watch over the Celery processes could not look: {error!r}")
            self.failing = True
            connection.close()

    def look(self, now: float) -> None:
        try:
            self.broker.ping()
            backlog = int(self.broker.llen(str(settings.CELERY_TASK_DEFAULT_QUEUE)))
        except redis.RedisError:
            self.broker_since = None  # nothing is judged while the broker is away, and its time not counted
            return
        if self.broker_since is None:
            self.broker_since = now
        self.ping_workers(now)
        beat_seen = ConsoleProcess.objects.filter(name=Role.BEAT).values_list("seen_at", flat=True).first()
        verdicts = liveness.hung(
            now, self.limit, self.broker_since,
            beat=liveness.Watched(Role.BEAT, self.beat.started_wall, wall(beat_seen)),
            workers=[liveness.Watched(role, child.started_wall, self.answered.get(role))
                     for role, child in self.workers.items()],
            beat_carrier=BEAT_CARRIER, carrier_backlog=backlog)
        for verdict in verdicts:
            child = self.beat if verdict.name == Role.BEAT else self.workers[verdict.name]
            why = f"silent for {verdict.silent_seconds:.0f} s (limit {self.limit:.0f} s)"
            if self.supervisor.kill(child, why):
                ConsoleProcess.restarted(verdict.name, datetime.fromtimestamp(now, UTC), verdict.silent_seconds)

    def ping_workers(self, now: float) -> None:
        names = {worker_hostname(role): role for role in self.workers}
        replies = app.control.ping(destination=list(names), timeout=PING_TIMEOUT_SECONDS, limit=len(names))
        at = datetime.fromtimestamp(now, UTC)
        for reply in replies or []:
            for hostname in reply:
                if hostname in names:
                    self.answered[names[hostname]] = now
                    ConsoleProcess.seen(names[hostname], at)
