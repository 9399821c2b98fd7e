"""An attack program: one rank starts threads, another forks children, each until the kernel refuses or a
target is reached, reports how far it got as one JSON line, and then holds what it has until it is ended.

The targets stay far below the host's pid_max on purpose: without a PIDs limit the bomb reaches its target
(and the test fails) instead of taking every PID of the machine the tests run on."""

import json
import os
import signal
import sys
import threading
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)
hold = threading.Event()


def thread_bomb(target: int) -> tuple[int, str]:
    threading.stack_size(64 * 1024)
    started = 0
    try:
        while started < target:
            threading.Thread(target=hold.wait, daemon=True).start()
            started += 1
    except RuntimeError as error:  # "can't start new thread": clone() failed with EAGAIN
        return started, str(error)
    return started, ""


def fork_bomb(target: int) -> tuple[int, str]:
    forked = 0
    try:
        while forked < target:
            if os.fork() == 0:
                # A child holds its PID and does nothing else: no MPI, no exit handlers.
                signal.pause()
                os._exit(0)
            forked += 1
    except OSError as error:  # fork() failed: EAGAIN at the limit
        return forked, f"{type(error).__name__}: {error}"
    return forked, ""


if rank == int(options.get("thread_rank", "0")):
    reached, error = thread_bomb(int(options.get("threads", "6000")))
    print("BOMB " + json.dumps({"rank": rank, "kind": "threads", "reached": reached, "error": error}), flush=True)
elif rank == int(options.get("fork_rank", "2")):
    reached, error = fork_bomb(int(options.get("forks", "3000")))
    print("BOMB " + json.dumps({"rank": rank, "kind": "forks", "reached": reached, "error": error}), flush=True)
# Held until the job is stopped; a rank that prints nothing is fine (no watchdog is set).
time.sleep(int(options.get("hold_seconds", "600")))
