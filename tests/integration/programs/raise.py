"""A test program: one rank raises an exception while the others wait for it in a collective.

Like a framework's rank (PyTorch, or mpi4py with rc.finalize off) the process does not hold MPI open at
exit, so the exception ends it with exit code 1 and mpirun ends the others.
"""

import sys
import time

import mpi4py

mpi4py.rc.finalize = False
from mpi4py import MPI  # noqa: E402 - the option above must be set before MPI starts

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)

comm.Barrier()
print(f"rank {rank} ready", flush=True)
if rank == int(options.get("rank", "1")):
    time.sleep(0.5)
    raise ValueError(f"bad batch shape on rank {rank}")
comm.Barrier()
