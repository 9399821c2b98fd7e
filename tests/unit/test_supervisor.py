"""runconsole's supervisor, with real child processes: a child that dies is started again after a pause
that grows with quick crashes, and a child never outlives the supervisor."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from console.supervisor import MAX_BACKOFF_SECONDS, Supervisor


def crashing() -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", "exit 3"])


def wait_exited(child) -> None:
    child.process.wait(timeout=10)


def test_a_child_that_crashes_is_started_again_after_a_pause_that_doubles_each_quick_crash():
    said: list[str] = []
    supervisor = Supervisor(say=said.append)
    child = supervisor.add("worker", crashing)
    pauses = []
    now = time.monotonic()
    for _ in range(7):
        wait_exited(child)
        supervisor.poll(now)
        # restart_at is now + the pause: subtracting now back gives it to within a float's rounding.
        pauses.append(round(child.restart_at - now, 6))
        first = child.process
        supervisor.poll(now + pauses[-1] - 0.01)
        assert child.process is first, "started again before its pause was over"
        now += pauses[-1]
        supervisor.poll(now)
        assert child.process is not first
    wait_exited(child)
    assert pauses == [1, 2, 4, 8, 16, MAX_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS]
    assert child.history == [3] * 7 and child.restarts == 7
    assert said[0] == "worker exited with 3; starting it again in 1 s"


def test_a_child_that_ran_a_while_before_it_died_is_started_again_at_once():
    supervisor = Supervisor(say=lambda text: None)
    child = supervisor.add("web", crashing)
    child.backoff = 16
    child.started_at = time.monotonic() - 120
    wait_exited(child)
    now = time.monotonic()
    supervisor.poll(now)
    assert child.restart_at == now + 1


def test_a_child_ends_when_its_supervisor_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        from console.supervisor import end_with_parent
        child = subprocess.Popen(["sleep", "60"], preexec_fn=end_with_parent)
        print(child.pid, flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    child_pid = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child_pid}") and "Z" not in open(f"/proc/{child_pid}/stat").read().split()[2]:
        assert time.monotonic() < deadline, "the child outlived its supervisor"
        time.sleep(0.05)
