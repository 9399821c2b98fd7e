"""An attack program: each rank tries to make a user namespace (as `unshare -Urm` and as a raw unshare(2)),
then checks that what jobs do need still works (threads, fork, a subprocess, an allreduce), and reports
all of it as one JSON line."""

import ctypes
import errno
import json
import os
import shutil
import subprocess
import threading

from mpi4py import MPI

CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
comm = MPI.COMM_WORLD
rank = comm.Get_rank()


def unshare_command() -> dict:
    if shutil.which("unshare") is None:
        return {"rc": None, "said": "no unshare in the image"}
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /mnt && echo mounted"],
                          capture_output=True, text=True, timeout=30)
    return {"rc": done.returncode, "said": (done.stdout + done.stderr).strip()[:200]}


def unshare_call() -> str:
    """unshare(CLONE_NEWUSER | CLONE_NEWNS) in a child, so the rank itself never leaves its namespaces."""
    child = os.fork()
    if child == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        code = 0 if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0 else ctypes.get_errno()
        os._exit(code)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    return "made" if code == 0 else errno.errorcode.get(code, str(code))


def threads_work() -> bool:
    results: list[int] = []
    workers = [threading.Thread(target=results.append, args=(index,)) for index in range(16)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sorted(results) == list(range(16))


def fork_works() -> bool:
    child = os.fork()
    if child == 0:
        os._exit(7)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 7


report = {"rank": rank, "unshare_command": unshare_command(), "unshare_call": unshare_call(),
          "threads": threads_work(), "fork": fork_works(),
          "subprocess": subprocess.run(["python", "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip(),
          "allreduce": comm.allreduce(rank + 1)}
print("USERNS " + json.dumps(report), flush=True)
