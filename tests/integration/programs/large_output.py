"""Writes one file of --mib MiB (seeded bytes) into --train_url on rank 0 and prints its SHA-256: an output
larger than a part, so the console uploads it in parts."""

import argparse
import hashlib
import os
import random

from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--train_url")
parser.add_argument("--mib", type=int, default=12)
args, _ = parser.parse_known_args()

if MPI.COMM_WORLD.Get_rank() == 0:
    content = random.Random(7).randbytes(args.mib * 1024 * 1024)
    os.makedirs(args.train_url, exist_ok=True)
    with open(os.path.join(args.train_url, "model.bin"), "wb") as target:
        target.write(content)
    print(f"wrote model.bin sha256 {hashlib.sha256(content).hexdigest()}", flush=True)
MPI.COMM_WORLD.Barrier()
