"""`make run`'s process, supervised: a child that dies (here the Celery worker, SIGKILLed) is started again
while the rest runs on, beat runs once and on its own, and nothing outlives the console."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console import services
from tests.integration.helpers import BASE_DIR

pytestmark = pytest.mark.fault("a child of the console (its Celery worker) killed",
                               "it is started again; the web server and beat run on; no second beat")


def children_of(pid: int) -> dict[int, str]:
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def role(children: dict[int, str], word: str) -> list[int]:
    return [pid for pid, command in children.items() if f"console {word}" in command or f"-A console {word}" in command]


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return result


def test_the_console_starts_a_killed_worker_again_and_keeps_one_beat(tmp_path):
    web_port, redis_port = services.free_port(), services.free_port()
    env = {**os.environ, "CONSOLE_VAR_DIR": str(tmp_path), "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
           "CELERY_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0"}
    env.pop("DATABASE_URL", None)
    log = open(tmp_path / "runconsole.log", "wb")
    console = subprocess.Popen([sys.executable, "manage.py", "runconsole", "--no-cluster", "--port", str(web_port)],
                               cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)
    after: dict[int, str] = {}
    try:
        services.wait_for_port("127.0.0.1", web_port, 90, console)
        before = wait_until(lambda: (c := children_of(console.pid)) and len(role(c, "worker")) == 2
                            and role(c, "beat") and c, 30, "the two workers (runs, control) and beat did not start")
        [beat] = role(before, "beat")
        [worker] = [pid for pid in role(before, "worker") if "--queues runs" in before[pid]]
        [control] = [pid for pid in role(before, "worker") if "--queues control" in before[pid]]

        os.kill(worker, signal.SIGKILL)

        after = wait_until(lambda: (c := children_of(console.pid)) and len(role(c, "worker")) == 2
                           and worker not in role(c, "worker") and c, 30, "the killed worker was not started again")
        assert console.poll() is None, "the console stopped"
        assert control in role(after, "worker"), "the control worker runs on"
        assert role(after, "beat") == [beat], "beat runs on, once"
        assert services.port_answers("127.0.0.1", web_port)
    finally:
        console.send_signal(signal.SIGTERM)
        console.wait(timeout=60)
        log.close()
    # Checked by pid: once the console is gone, what it left would belong to init.
    assert wait_until(lambda: not [pid for pid in after if alive(pid)], 15, "children outlived the console")
    assert "celery worker (runs) exited with -9; starting it again in 1 s" in (tmp_path / "runconsole.log").read_text()
