"""A program that takes no notice of the notice before a stop: it ignores the signal, writes a manifest the
console must not trust (a path outside the checkpoint folder), and goes on printing until it is ended."""

import json
import os
import signal
import time

from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
name = os.environ.get("MA_CHECKPOINT_SIGNAL", "SIGUSR1")
signal.signal(getattr(signal, name), lambda *_: print(f"rank {rank} got {name} and carries on", flush=True))
folder = os.environ.get("MA_CHECKPOINT_DIR", "")
if rank == 0 and folder:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "checkpoint.json"), "w") as manifest:
        json.dump({"step": 7, "path": "../../../../etc/passwd"}, manifest)
while True:
    print(f"tick rank={rank} at={time.time():.3f}", flush=True)
    time.sleep(0.2)
