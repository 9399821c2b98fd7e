"""An attack program: rank 0 writes zeros to a file as fast as it can, up to a target size, and says how far
it got after every 64 MiB (so the log tells how far past a disk limit it got before it was stopped). At its
target it goes on writing over its last chunk, for up to two minutes, so that a disk faster than the watch
(a page cache takes gigabytes a second) still leaves a writer running for the watch to stop."""

import os
import sys
import time

from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)
CHUNK = 64 * 1024 * 1024

if rank == 0:
    path = os.path.expanduser(options.get("path", "~/fill"))
    target = int(options.get("target_mb", "4096")) * 1024 * 1024
    block = b"\0" * CHUNK
    written = 0
    with open(path, "wb") as out:
        while written < target:
            out.write(block)
            written += CHUNK
            print(f"FILL wrote={written} at={time.time():.3f}", flush=True)
        until = time.time() + 120
        while time.time() < until:
            out.seek(written - CHUNK)
            out.write(block)
            out.flush()
            time.sleep(0.1)
    print(f"FILL done wrote={written}", flush=True)
    os.remove(path)
MPI.COMM_WORLD.Barrier()
