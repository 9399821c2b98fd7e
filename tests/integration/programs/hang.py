"""A test program: one rank stops printing and blocks forever; the others keep printing a heartbeat."""

import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)

print(f"rank {rank} started", flush=True)
if rank == int(options.get("rank", "1")):
    # Silent, and not working: the way a deadlocked or stuck rank looks from outside.
    time.sleep(3600)
for beat in range(int(options.get("beats", "3600"))):
    print(f"rank {rank} heartbeat {beat}", flush=True)
    time.sleep(0.5)
