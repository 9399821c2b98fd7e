"""Reads the job's input (--data_url, a local folder the platform filled, and --data_url_1 where given) on every
rank, then writes checkpoints into --train_url on rank 0, one every --every seconds, --steps of them, after those
already there. With --look, each rank says what it sees in that folder."""

import argparse
import hashlib
import os
import time

from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--data_url")
parser.add_argument("--data_url_1")
parser.add_argument("--train_url")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--every", type=float, default=0.0)
parser.add_argument("--look")
args, _ = parser.parse_known_args()
rank = MPI.COMM_WORLD.Get_rank()

names = sorted(os.path.relpath(os.path.join(top, name), args.data_url)
               for top, _, files in os.walk(args.data_url) for name in files)
digest = hashlib.sha256()
for name in names:
    with open(os.path.join(args.data_url, name), "rb") as source:
        digest.update(name.encode() + b"\0" + source.read())
print(f"rank {rank} read {len(names)} files from {args.data_url} digest {digest.hexdigest()} "
      f"(DATA_URL={os.environ.get('DATA_URL')})", flush=True)
if args.data_url_1:
    further = sorted(name for _, _, files in os.walk(args.data_url_1) for name in files)
    print(f"rank {rank} read {len(further)} further files ({' '.join(further)}) from {args.data_url_1} "
          f"(DATA_URL_1={os.environ.get('DATA_URL_1')})", flush=True)
if args.look:
    try:
        seen = " ".join(sorted(os.listdir(args.look)))
    except OSError as error:
        seen = f"nothing: {error.strerror}"
    print(f"rank {rank} sees [{seen}] in {args.look}", flush=True)
try:
    with open(os.path.join(args.data_url, "scribble.txt"), "w") as target:
        target.write("changed")
    print(f"rank {rank} could write into its input", flush=True)
except OSError as error:
    print(f"rank {rank} cannot write into its input: {error.strerror}", flush=True)

if rank == 0 and args.train_url:
    os.makedirs(os.path.join(args.train_url, "checkpoints"), exist_ok=True)
    # A run whose train_url was brought back resumes after the checkpoints it finds there.
    start = len(os.listdir(os.path.join(args.train_url, "checkpoints")))
    print(f"resuming after {start} checkpoint(s)", flush=True)
    for step in range(start, start + args.steps):
        with open(os.path.join(args.train_url, "checkpoints", f"step-{step}.txt"), "w") as target:
            target.write(f"weights after step {step}\n" * 100)
        print(f"saved checkpoint {step}", flush=True)
        time.sleep(args.every)
MPI.COMM_WORLD.Barrier()
