"""Starting the console's processes (Redis, a Celery worker and beat, the web server), for `runconsole` and the tests.

A dev and test helper, outside the app's import graph: only `manage.py runconsole`, the tests and the
benchmarks import it; no view, task or model does.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not port_answers(host, port):
        if process is not None and process.poll() is not None:
            program = process.args[0] if isinstance(process.args, list | tuple) else process.args
            raise RuntimeError(f"{program!s} exited with {process.returncode} before {host}:{port} opened")
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing answered on {host}:{port} within {timeout:.0f} s")
        time.sleep(0.1)


def start_redis(port: int, log_path: Path, preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian package redis-server)")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--logfile", str(log_path), "--dir", str(log_path.parent)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        preexec_fn=preexec_fn,
    )
    wait_for_port("127.0.0.1", port, 10, process)
    return process


def start_celery_worker(env: dict[str, str], log_path: Path, concurrency: int | None = None, beat: bool = False,
                        preexec_fn: Callable[[], None] | None = None, queues: str = "",
                        name: str = "") -> subprocess.Popen:
    # Threads, not processes: a job's task mostly waits on SSH, and a stop must run beside it.
    # Without `concurrency`, the worker's own settings say (WORKER_THREADS, from its environment).
    # `queues`: "runs", "control" or both (the default): see CELERY_TASK_QUEUES in console/settings.py.
    command = [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool", "threads",
               "--loglevel", "INFO", "--without-gossip", "--without-mingle"]
    if concurrency:
        command += ["--concurrency", str(concurrency)]
    if queues:
        command += ["--queues", queues]
    if name:
        command += ["--hostname", f"{name}@%h"]
    if beat:
        command += ["--beat", "--schedule", str(log_path.parent / "celerybeat-schedule")]
    log = open(log_path, "ab")
    return subprocess.Popen(command, cwd=BASE_DIR, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=preexec_fn)


def start_celery_beat(env: dict[str, str], log_path: Path, preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen:
    """Celery beat on its own: one scheduler, whose pidfile refuses a second one beside it."""
    command = [sys.executable, "-m", "celery", "-A", "console", "beat", "--loglevel", "INFO",
               "--schedule", str(log_path.parent / "celerybeat-schedule"),
               "--pidfile", str(log_path.parent / "celerybeat.pid")]
    log = open(log_path, "ab")
    return subprocess.Popen(command, cwd=BASE_DIR, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=preexec_fn)


def web_server_command(host: str, port: int, log_level: str = "info") -> list[str]:
    """uvicorn serving the console, with the console's own HTTP/1.1 protocol: h11 with a deadline on each
    request's headers (console.request_limits), which plain uvicorn does not have.

    X-Forwarded-For and -Proto are taken only from the proxies in TRUSTED_PROXIES: uvicorn's default trusts
    127.0.0.1, and every client on the console's own host could then choose the address its failures are
    counted against (console.security)."""
    from django.conf import settings

    proxies = list(settings.TRUSTED_PROXIES)
    forwarded = ["--proxy-headers", "--forwarded-allow-ips", ",".join(proxies)] if proxies else ["--no-proxy-headers"]
    return [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", host, "--port", str(port),
            "--http", "console.request_limits:HeaderDeadlineH11Protocol", *forwarded, "--log-level", log_level]


def start_web_server(port: int, env: dict[str, str], log_path: Path | None = None, host: str = "127.0.0.1",
                     log_level: str = "warning", preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen:
    """The web server as `runconsole` starts it, once it answers on its port."""
    log = open(log_path, "ab") if log_path is not None else None
    process = subprocess.Popen(web_server_command(host, port, log_level), cwd=BASE_DIR, env={**os.environ, **env},
                               stdout=log, stderr=subprocess.STDOUT if log else None, preexec_fn=preexec_fn)
    try:
        wait_for_port("127.0.0.1" if host in ("0.0.0.0", "") else host, port, 30, process)
    except BaseException:
        stop(process)
        raise
    return process


def stop(process: subprocess.Popen | None, timeout: float = 15) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_object_store(argv: list[str], address: str, port: int, log_path: Path,
                       preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen:
    """SeaweedFS (jobs.localstore.server_argv), once its S3 gateway answers and it can store a file: the
    gateway opens a few seconds before its volume server has registered (a write then fails with a 500)."""
    with open(log_path, "ab") as log:
        # Started in its data's folder, where it reads its master.toml.
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec_fn,
                                   cwd=Path(next(word for word in argv if word.startswith("-dir="))[5:]).parent)
    wait_for_port(address, port, 60, process)
    deadline = time.monotonic() + 60
    # The master (on the next port, this machine only) assigns a file id once a volume takes writes.
    while b'"fid"' not in _answer(f"http://127.0.0.1:{port + 1}/dir/assign"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the object store on {address}:{port} takes no write (see {log_path})")
        time.sleep(0.25)
    return process


def _answer(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bytes(response.read())
    except (OSError, ValueError):
        return b""
