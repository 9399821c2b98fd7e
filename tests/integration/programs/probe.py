"""A test program: each rank reports where it runs and what it was given, as one JSON line."""

import json
import os
import socket
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
args = sys.argv[1:]
options = dict(arg[2:].split("=", 1) for arg in args if arg.startswith("--") and "=" in arg)

shown = [name for name in options.get("show_env", "").split(",") if name]
total = comm.allreduce(rank + 1)


def cache_writable() -> bool:
    """The platform's local disk for the job (/cache, as on the reference): the job's user writes there."""
    try:
        with open(f"/cache/probe-{rank}", "w") as probe:
            probe.write("x")
        return os.stat("/cache").st_uid == os.getuid()
    except OSError:
        return False


print("PROBE " + json.dumps({
    "rank": rank,
    "size": comm.Get_size(),
    "host": socket.gethostname(),
    "cwd": os.getcwd(),
    "user": os.getuid(),
    "argv": args,
    "env": {name: os.environ.get(name) for name in shown},
    "allreduce": total,
    "cache_writable": cache_writable(),
}), flush=True)

for number in range(int(options.get("count", "0"))):
    print(f"SEQ {rank} {number}", flush=True)

if options.get("sleep"):
    time.sleep(float(options["sleep"]))
comm.Barrier()
if options.get("exit_rank") is not None and int(options["exit_rank"]) == rank:
    sys.exit(int(options.get("exit_code", "1")))
