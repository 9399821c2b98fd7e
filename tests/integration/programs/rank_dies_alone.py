"""A test program for a rank that dies while the others wait: rank 0 cannot write where it was told to (as
with a train_url the job may not write) and raises; the other ranks wait in a barrier it never reaches."""

import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
print(f"started rank={rank}", flush=True)
time.sleep(2)
if rank == 0:
    with open("/usr/forbidden-output", "w") as output:
        output.write("nothing")
comm.Barrier()
print(f"passed the barrier rank={rank}", flush=True)
