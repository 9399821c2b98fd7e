"""A test program: rank 0 writes files into train_url (a small result, a nested file and a large one)."""

import os
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)

if rank == 0:
    root = options["train_url"]
    os.makedirs(os.path.join(root, "checkpoints"), exist_ok=True)
    with open(os.path.join(root, "result.txt"), "w") as result:
        result.write(f"trained by {comm.Get_size()} ranks\n")
    with open(os.path.join(root, "checkpoints", "step-1.txt"), "w") as checkpoint:
        checkpoint.write("weights 1 2 3\n")
    with open(os.path.join(root, "big.bin"), "wb") as big:
        big.write(os.urandom(int(options.get("big_bytes", "0"))))
    print(f"wrote outputs to {root}", flush=True)
comm.Barrier()
