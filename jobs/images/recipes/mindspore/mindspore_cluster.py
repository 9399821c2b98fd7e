"""The platform's start of MindSpore's dynamic cluster for ranks that mpirun started (the image's own).

MindSpore's CPU build does not support mpirun: under it `init()` fails ("Failed to initialize
communication library on device side"). Its documented dynamic cluster start works when, before
`import mindspore`, every rank removes OMPI_COMMAND and PMIX_RANK and sets MS_ROLE=MS_WORKER,
MS_WORKER_NUM (the world size), MS_NODE_ID (its rank), MS_SCHED_HOST (worker-0's address) and
MS_SCHED_PORT (one port per job), and rank 0 also runs one scheduler (MS_ROLE=MS_SCHED) that ends with
it. This module does that when such a process first imports mindspore, so the user's code calls plain
`mindspore.communication.init()`. A .pth file imports it at every Python start; it costs nothing to a
process that is not an mpirun rank or that never imports mindspore, and does nothing if MS_ROLE is
already set (a user who starts the cluster their own way).
"""

import os
import sys

WAIT_FOR_SCHEDULER_S = 120
SCHEDULER_END_GRACE_S = 30
_scheduler = None


def _port() -> int:
    """One port per job: the job's sshd port (from mpirun's `-mca plm_rsh_args "-p N"`) + 1000, else a
    port from the job's host names."""
    words = os.environ.get("OMPI_MCA_plm_rsh_args", "").split()
    if "-p" in words[:-1]:
        try:
            return 1024 + (int(words[words.index("-p") + 1]) + 1000 - 1024) % (65536 - 1024)
        except ValueError:
            pass
    import zlib

    return 40000 + zlib.crc32(os.environ.get("VC_WORKER_HOSTS", "").encode()) % 10000


def _log_path() -> str:
    folder = os.environ.get("MA_LOG_DIR") or "/tmp"
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        folder = "/tmp"
    return os.path.join(folder, "mindspore-scheduler.log")


def _start_scheduler(environment: dict) -> None:
    global _scheduler
    import atexit
    import ctypes
    import signal
    import subprocess

    def die_with_rank_0():
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass

    code = ("import mindspore\n"
            "from mindspore.communication import init\n"
            "mindspore.set_context(device_target='CPU')\n"
            "init()\n")
    log = open(_log_path(), "ab")
    _scheduler = subprocess.Popen([sys.executable, "-c", code], env={**environment, "MS_ROLE": "MS_SCHED"},
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=die_with_rank_0, close_fds=True)
    log.close()

    def end_scheduler():
        # Registered before mindspore is imported, so it runs after mindspore's own finalization: the
        # scheduler ends by itself once every worker has finished; it never outlives rank 0.
        if _scheduler.poll() is None:
            try:
                _scheduler.wait(SCHEDULER_END_GRACE_S)
            except subprocess.TimeoutExpired:
                _scheduler.kill()
                _scheduler.wait()

    atexit.register(end_scheduler)


def _wait_for(host: str, port: int) -> None:
    """MindSpore retries a worker that connected before the scheduler listened only every ~30 s."""
    import socket
    import time

    deadline = time.monotonic() + WAIT_FOR_SCHEDULER_S
    while True:
        try:
            socket.create_connection((host, port), timeout=2).close()
            return
        except OSError:
            pass
        if _scheduler is not None and _scheduler.poll() is not None:
            raise RuntimeError(f"MindSpore's scheduler ended with {_scheduler.returncode}; see {_log_path()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"MindSpore's scheduler at {host}:{port} did not answer in {WAIT_FOR_SCHEDULER_S} s")
        time.sleep(0.2)


def start_cluster() -> None:
    import socket

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    host = os.environ.get("VC_WORKER_HOSTS", "").split(",")[0] or "localhost"
    address = socket.gethostbyname(host)
    port = _port()
    for name in ("OMPI_COMMAND", "PMIX_RANK"):
        os.environ.pop(name, None)
    os.environ.setdefault("GLOG_v", "2")  # MindSpore's own log: warnings and errors, unless the job says otherwise
    os.environ.update({"MS_ROLE": "MS_WORKER", "MS_WORKER_NUM": str(size), "MS_NODE_ID": str(rank),
                       "MS_SCHED_HOST": address, "MS_SCHED_PORT": str(port)})
    if rank == 0:
        scheduler_env = {name: value for name, value in os.environ.items() if not name.startswith(("OMPI_", "PMIX_"))}
        _start_scheduler(scheduler_env)
    _wait_for(address, port)


class _BeforeMindSpore:
    """Runs start_cluster() once, when mindspore is first imported, before any of it runs."""

    def find_spec(self, name, path=None, target=None):
        if name == "mindspore" or name.startswith("mindspore."):
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            start_cluster()
        return None


if "OMPI_COMM_WORLD_RANK" in os.environ and "MS_ROLE" not in os.environ:
    sys.meta_path.insert(0, _BeforeMindSpore())
