"""`runconsole`'s children (Redis, the Celery worker, Celery beat, the web server), kept running.

A child that exits is started again after a pause that doubles with each quick crash (up to
MAX_BACKOFF_SECONDS), instead of taking the whole console and its local cluster down. Each child is
asked by the kernel to end when the supervisor dies (PR_SET_PDEATHSIG), so none is left orphaned,
still queueing tasks, beside the next console. A child that hangs instead of exiting is killed by whoever
watches it (kill(); runconsole's watch over the Celery processes) and so started again too.
"""

import ctypes
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PR_SET_PDEATHSIG = 1
MAX_BACKOFF_SECONDS = 30.0
# A child that ran this long before it exited is taken as healthy again: its pause starts over.
HEALTHY_AFTER_SECONDS = 60.0


def end_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGTERM when the process that started it dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    start: Callable[[], subprocess.Popen]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    started_wall: float = 0.0  # the same moment on the wall clock, which other processes' records use
    backoff: float = 1.0
    restart_at: float | None = None
    restarts: int = 0
    history: list[int | None] = field(default_factory=list)  # exit codes, in order


class Supervisor:
    def __init__(self, say: Callable[[str], None] = print):
        self.children: list[Child] = []
        self.say = say

    def add(self, name: str, start: Callable[[], subprocess.Popen]) -> Child:
        child = Child(name, start)
        self.launch(child)
        self.children.append(child)
        return child

    def launch(self, child: Child, now: float | None = None) -> None:
        child.process = child.start()
        child.started_at = time.monotonic() if now is None else now
        child.started_wall = time.time()
        child.restart_at = None

    def poll(self, now: float | None = None) -> None:
        """Start again what exited once its pause is over; call this every fraction of a second."""
        now = time.monotonic() if now is None else now
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restarts += 1
                    self.say(f"starting {child.name} again (restart {child.restarts})")
                    self.launch(child, now)
                continue
            code = child.process.poll() if child.process else None
            if child.process is None or code is None:
                continue
            child.history.append(code)
            if now - child.started_at >= HEALTHY_AFTER_SECONDS:
                child.backoff = 1.0
            child.restart_at = now + child.backoff
            self.say(f"{child.name} exited with {code}; starting it again in {child.backoff:.0f} s")
            child.backoff = min(child.backoff * 2, MAX_BACKOFF_SECONDS)

    def kill(self, child: Child, why: str) -> bool:
        """End a child that hangs, for poll() to start it again as any child that exited; False if it had ended
        already. SIGKILL: a SIGSTOPped process keeps a SIGTERM pending until it is continued."""
        if child.process is None or child.process.poll() is not None:
            return False
        self.say(f"{child.name} {why}: killing it")
        child.process.kill()
        child.process.wait()
        return True

    def stop_all(self, stop: Callable[[subprocess.Popen], None]) -> None:
        for child in reversed(self.children):
            if child.process is not None:
                stop(child.process)
