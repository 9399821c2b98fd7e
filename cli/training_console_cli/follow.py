"""Following a job's log over the console's Server-Sent Events, resuming with Last-Event-ID after a lost
connection: each line is printed once, in order, none left out; then the job's end becomes tc's exit code."""

import http.client
import json
import sys
import time
from collections.abc import Callable, Iterator

from .api import Client, Unreachable
from .errors import CliError

# A quiet stream carries a comment every 15 s; past this the connection is taken for lost.
READ_TIMEOUT_SECONDS = 45
RECONNECT_GIVE_UP_SECONDS = 120
# A job stopped by someone, or lost by the console: not a success, and not any rank's code.
EXIT_STOPPED = 143
EXIT_ABNORMAL = 70
FINAL = {"Completed", "Failed", "Terminated", "Abnormal"}


def exit_code_of(job: dict) -> int:
    """Completed 0; Failed the failed rank's exit code (mpirun's), 1 when there is none; stopped or abnormal
    their own codes."""
    status = job.get("status")
    if status == "Completed":
        return 0
    if status == "Failed":
        code = job.get("exit_code")
        return code if isinstance(code, int) and 0 < code < 256 else 1
    if status == "Terminated":
        return EXIT_STOPPED
    return EXIT_ABNORMAL


def events(lines: Iterator[bytes]) -> Iterator[dict]:
    """SSE events ({"event", "id", "data"}) from a stream's lines; comments are skipped."""
    event: dict = {}
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if "data" in event or "id" in event:
                yield event
            event = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            event["data"] = f"{event['data']}\n{value}" if "data" in event else value
        elif name in ("event", "id"):
            event[name] = value


class Follower:
    """One job's live log; `last_id` is where a new connection resumes, so a reconnect repeats nothing."""

    def __init__(self, client: Client, job_id: int, query: dict, show: Callable[[dict], None],
                 last_id: str | None = None, say: Callable[[str], None] | None = None):
        self.client, self.job_id, self.query, self.show = client, job_id, query, show
        self.last_id = last_id
        self.say = say or (lambda text: print(f"tc: {text}", file=sys.stderr, flush=True))
        self.ended: dict | None = None
        self.received = 0

    def run(self) -> dict:
        """Follow until the job is over and every line was shown; the job's detail at its end."""
        lost_since: float | None = None
        while self.ended is None:
            received = self.received
            try:
                self.follow_once()
            except (OSError, http.client.HTTPException) as error:
                # Time without an event counts from the last connection that brought one.
                if lost_since is None or self.received > received:
                    lost_since = time.monotonic()
                if time.monotonic() - lost_since > RECONNECT_GIVE_UP_SECONDS:
                    raise CliError(f"lost the log stream and could not reconnect for {RECONNECT_GIVE_UP_SECONDS} s: "
                                   f"{error}") from None
                self.say(f"connection lost ({error}); resuming after line {self.last_id or 0}")
                time.sleep(1)
        return self.client.get(f"training-jobs/{self.job_id}")

    def follow_once(self) -> None:
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = self.last_id
        try:
            response = self.client.open("GET", f"training-jobs/{self.job_id}/log/events", query=self.query,
                                        headers=headers, timeout=READ_TIMEOUT_SECONDS)
        except Unreachable as error:
            raise OSError(str(error)) from None
        with response:
            for event in events(iter(response.readline, b"")):
                self.take(event)
                if self.ended is not None:
                    return
        # The stream closed before its end event: the connection was lost.
        raise OSError("the stream closed before the job's end")

    def take(self, event: dict) -> None:
        self.received += 1
        kind = event.get("event", "message")
        data = json.loads(event.get("data") or "null")
        if kind == "message" and isinstance(data, dict):
            self.show(data)
        elif kind == "end":
            self.ended = data if isinstance(data, dict) else {}
        # The id moves on only once its event was handled: a line is never skipped on a reconnect.
        if "id" in event:
            self.last_id = event["id"]
