"""`make run`'s process, supervised: a child that dies (here the Celery worker, SIGKILLed) is started again
while the rest runs on, beat runs once and on its own, and nothing outlives the console; a beat that hangs
(SIGSTOPped) is killed and started again, and the capacity page says when."""

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

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


@contextmanager
def console_running(tmp_path: Path, **env_overrides: str):
    """`runconsole` without a cluster on a database and a Redis of its own, once its web server answers: its
    process and its web server's port."""
    web_port, redis_port = services.free_port(), services.free_port()
    env = {**os.environ, "CONSOLE_VAR_DIR": str(tmp_path), "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
           "CELERY_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0", **env_overrides}
    env.pop("DATABASE_URL", None)
    log = open(tmp_path / "runconsole.log", "wb")
    console = subprocess.Popen([sys.executable, "manage.py", "runconsole", "--no-cluster", "--port", str(web_port)],
                               cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        services.wait_for_port("127.0.0.1", web_port, 90, console)
        yield console, web_port
    finally:
        console.send_signal(signal.SIGTERM)
        console.wait(timeout=60)
        log.close()


def test_the_console_starts_a_killed_worker_again_and_keeps_one_beat(tmp_path):
    after: dict[int, str] = {}
    with console_running(tmp_path) as (console, web_port):
        before = wait_until(lambda: (c := children_of(console.pid)) and len(role(c, "worker")) == 3
                            and role(c, "beat") and c, 30,
                            "the three workers (runs, control, shells) and beat did not start")
        [beat] = role(before, "beat")
        [worker] = [pid for pid in role(before, "worker") if "--queues runs" in before[pid]]
        [control] = [pid for pid in role(before, "worker") if "--queues control" in before[pid]]

        os.kill(worker, signal.SIGKILL)

        after = wait_until(lambda: (c := children_of(console.pid)) and len(role(c, "worker")) == 3
                           and worker not in role(c, "worker") and c, 30, "the killed worker was not started again")
        assert console.poll() is None, "the console stopped"
        assert control in role(after, "worker"), "the control worker runs on"
        assert role(after, "beat") == [beat], "beat runs on, once"
        assert services.port_answers("127.0.0.1", web_port)
    # Checked by pid: once the console is gone, what it left would belong to init.
    assert wait_until(lambda: not [pid for pid in after if alive(pid)], 15, "children outlived the console")
    assert "celery worker (runs) exited with -9; starting it again in 1 s" in (tmp_path / "runconsole.log").read_text()


def signed_in(tmp_path: Path, web_port: int) -> requests.Session:
    """A browser session of the admin account `runconsole` made, whose password it printed once."""
    [password] = re.findall(r"admin account: admin / (\S+)", (tmp_path / "runconsole.log").read_text())
    session = requests.Session()
    session.headers["Accept-Language"] = "en"
    login = f"http://127.0.0.1:{web_port}/accounts/login/"
    session.get(login, timeout=10)
    answer = session.post(login, timeout=10, data={"username": "admin", "password": password,
                                                    "csrfmiddlewaretoken": session.cookies["csrftoken"]})
    assert answer.ok and "sessionid" in session.cookies, "the admin could not sign in"
    return session


def process_row(session: requests.Session, web_port: int, name: str = "beat") -> str:
    """The capacity page's row of one of the console's Celery processes."""
    page = session.get(f"http://127.0.0.1:{web_port}/capacity", timeout=10).text
    return page.split(f'data-process="{name}"', 1)[1].split("</tr>", 1)[0]


HUNG_LIMIT = 8  # seconds; beat then ticks every 2 s


def hang_and_see_restarted(console, tmp_path, queue: str) -> None:
    """SIGSTOP the console's worker of `queue`: it must be killed, said so, and a new one started."""
    [worker] = [pid for pid, command in children_of(console.pid).items() if f"--queues {queue}" in command]
    os.kill(worker, signal.SIGSTOP)
    wait_until(lambda: [pid for pid, command in children_of(console.pid).items()
                        if f"--queues {queue}" in command and pid != worker], HUNG_LIMIT + 15,
               f"the hung {queue} worker was not started again")
    assert not alive(worker), f"the hung {queue} worker was left behind"
    assert re.search(rf"celery worker \({queue}\) silent for \d+ s \(limit {HUNG_LIMIT} s\): killing it",
                     (tmp_path / "runconsole.log").read_text())


@pytest.mark.fault("Celery beat, then the runs worker, then the shells worker, hung (SIGSTOP) under the console",
                   "each killed and started again within HUNG_PROCESS_SECONDS; the capacity page says so")
def test_the_console_kills_a_hung_beat_or_worker_and_starts_it_again_and_the_capacity_page_says_so(tmp_path):
    with console_running(tmp_path, HUNG_PROCESS_SECONDS=str(HUNG_LIMIT)) as (console, web_port):
        session = signed_in(tmp_path, web_port)
        # Judged only once it has ticked since its start (a process starting is given time).
        wait_until(lambda: "last seen" in process_row(session, web_port), 90, "beat's heartbeat never ran")
        [beat] = role(children_of(console.pid), "beat")

        os.kill(beat, signal.SIGSTOP)
        stopped_at = time.monotonic()

        # Its silence reaches the limit at most a tick after the stop; the watch looks every tick, the restart
        # follows a second later: the margin is for a loaded machine.
        new_beat = wait_until(lambda: [pid for pid in role(children_of(console.pid), "beat") if pid != beat],
                              HUNG_LIMIT + 15, "the hung beat was not started again")
        assert time.monotonic() - stopped_at >= HUNG_LIMIT - 2, "beat was killed before it was silent for the limit"
        assert not alive(beat), "the hung beat was left behind"
        assert console.poll() is None and len(role(children_of(console.pid), "worker")) == 3
        log = (tmp_path / "runconsole.log").read_text()
        assert re.search(rf"celery beat silent for \d+ s \(limit {HUNG_LIMIT} s\): killing it", log)
        assert "celery beat exited with -9; starting it again in 1 s" in log
        row = wait_until(lambda: (row := process_row(session, web_port)) and "last seen" in row
                         and "data-stale" not in row and row, 60, f"the new beat {new_beat} never ticked")
        assert re.search(r"killed after \d+ s of silence \(1 restart in all\)", row), row

        hang_and_see_restarted(console, tmp_path, "runs")
        assert re.search(r"killed after \d+ s of silence \(1 restart in all\)",
                         process_row(session, web_port, "worker-runs"))

        # The terminals' worker likewise: a hung one would leave every shell session unanswered.
        wait_until(lambda: "last seen" in process_row(session, web_port, "worker-shells"), 60,
                   "the shells worker was never seen")
        hang_and_see_restarted(console, tmp_path, "shells")
