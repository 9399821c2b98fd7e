"""Whether Celery beat and the workers are alive, judged from when each last gave a sign of life.

A process that hangs (SIGSTOPped, deadlocked, swapped out) does not exit, so the supervisor's restart on exit
never sees it: beat then sends nothing (node checks, the reaper, the dispatch stop) and a worker takes nothing.
Beat's sign of life is its heartbeat task, run by the control worker; a worker's is its answer to a ping.

Plain Python on plain numbers (seconds since the epoch), so that the judgement is tested with a clock of its own.
"""

from dataclasses import dataclass

# Beat's heartbeat is sent this many times within the limit: one late or lost tick is no alarm.
TICKS_PER_LIMIT = 4
LONGEST_TICK_SECONDS = 10.0
# A process (re)started is given this long to come up before its silence counts.
STARTING_SECONDS = 60.0


def heartbeat_seconds(limit: float) -> float:
    """How often beat sends its heartbeat, for a process silent `limit` seconds to be taken as hung."""
    return max(1.0, min(LONGEST_TICK_SECONDS, limit / TICKS_PER_LIMIT))


def silent_for(now: float, seen_at: float | None, since: float) -> float:
    """Seconds without a sign of life; a process is not blamed for the time before `since` (its start, or
    the moment the broker answered again)."""
    return now - max(since, seen_at if seen_at is not None else since)


def is_stale(now: float, seen_at: float | None, limit: float) -> bool:
    """What the pages say: a process last seen longer ago than the limit (or never) may hang."""
    return seen_at is None or now - seen_at > limit


@dataclass
class Watched:
    """One supervised process as the watch sees it: when it was (re)started and when it last gave a sign."""

    name: str
    started_at: float
    seen_at: float | None = None

    def silence(self, now: float, since: float) -> float:
        """Its silence from `since` on. One not yet seen since its start may take STARTING_SECONDS to come up
        (a worker loads Django, beat ticks first one tick after its start) before its silence counts."""
        if self.seen_at is None or self.seen_at < self.started_at:
            return now - max(since, self.started_at + STARTING_SECONDS)
        return silent_for(now, self.seen_at, max(since, self.started_at))


@dataclass(frozen=True)
class Verdict:
    name: str
    silent_seconds: float


def hung(now: float, limit: float, broker_since: float | None, beat: Watched | None, workers: list[Watched],
         beat_carrier: str, carrier_backlog: int) -> list[Verdict]:
    """The processes silent past `limit`, to be killed and started again.

    broker_since: since when the broker has answered without a break, None while it does not: without it no
    ping is answered and no heartbeat goes out, and restarting the Celery processes would not help.
    beat_carrier: the worker that runs beat's heartbeat, whose silence would silence beat's too; beat is judged
    only while that worker answers and its queue is empty (a heartbeat still waiting there is beat's sign).
    """
    if broker_since is None:
        return []
    silences = [Verdict(worker.name, worker.silence(now, broker_since)) for worker in workers]
    verdicts = [verdict for verdict in silences if verdict.silent_seconds > limit]
    carrier = next((worker for worker in workers if worker.name == beat_carrier), None)
    carrier_answers = carrier is not None and carrier.seen_at is not None and carrier.seen_at >= carrier.started_at \
        and all(verdict.name != beat_carrier for verdict in verdicts)
    if beat is not None and carrier is not None and carrier_answers and carrier_backlog == 0:
        silence = beat.silence(now, max(broker_since, carrier.started_at))
        if silence > limit:
            verdicts.append(Verdict(beat.name, silence))
    return verdicts
