"""A test program for auto restart: each rank says which attempt it is (MA_RESTART_COUNT); the first attempt
runs until it is stopped or a worker is lost, a restarted one "resumes from its checkpoint" and ends."""

import os
import time

from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
restarts = int(os.environ.get("MA_RESTART_COUNT", "-1"))
print(f"ATTEMPT rank={rank} restarts={restarts}", flush=True)
if restarts == 0:
    while True:
        print(f"working rank={rank}", flush=True)
        time.sleep(0.5)
print(f"RESUMED rank={rank}", flush=True)
MPI.COMM_WORLD.Barrier()
