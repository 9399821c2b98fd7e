"""A test program: one rank is killed with SIGKILL (as the out-of-memory killer does) while the others wait."""

import os
import signal
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)

comm.Barrier()
print(f"rank {rank} allocating", flush=True)
if rank == int(options.get("rank", "2")):
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
comm.Barrier()
