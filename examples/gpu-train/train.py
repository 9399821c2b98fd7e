"""A data-parallel training loop for the console's MPI engines.

Every rank fits the same linear model on its own shard of a synthetic data set and the gradients
are averaged across ranks each step, as Horovod does. On GPUs with PyTorch present it uses
torch.distributed with NCCL; otherwise mpi4py's allreduce on the CPU.

It meets the console's checkpoint contract: with MA_CHECKPOINT_DIR (an s3:// or obs:// train_url), rank 0
saves the weights every --checkpoint_every steps and says so in $MA_CHECKPOINT_DIR/checkpoint.json; given
MA_RESUME_FROM (an automatic restart, a requeue, a Rebuild that resumes) it starts after that checkpoint's
step, so the final weights are those of an uninterrupted run. On the notice before a stop
(MA_CHECKPOINT_SIGNAL) the ranks save at the next step and end.

Run by the platform as:  mpirun ... python train.py --data_url=... --train_url=... [--steps=N ...]
"""

import argparse
import json
import os
import signal
import socket
import sys
import time
from datetime import UTC, datetime


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_url", default="")
    parser.add_argument("--train_url", default="")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--samples_per_rank", type=int, default=512)
    parser.add_argument("--step_seconds", type=float, default=0.0)
    parser.add_argument("--checkpoint_every", type=int, default=5)
    known, unknown = parser.parse_known_args()
    return known, unknown


def torch_with_gpus():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


class MpiBackend:
    def __init__(self):
        from mpi4py import MPI

        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.name = "mpi4py allreduce (CPU)"

    def average(self, array):
        import numpy as np

        total = np.empty_like(array)
        self.comm.Allreduce(array, total)
        return total / self.size

    def finish(self):
        self.comm.Barrier()


class NcclBackend:
    def __init__(self, torch):
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        self.size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
        # The platform's documented way: the first worker's DNS name is the rendezvous address.
        os.environ.setdefault("MASTER_ADDR", os.environ.get("VC_WORKER_HOSTS", "localhost").split(",")[0])
        os.environ.setdefault("MASTER_PORT", "29500")
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        dist.init_process_group("nccl", rank=self.rank, world_size=self.size)
        self.name = f"torch.distributed NCCL on cuda:{torch.cuda.current_device()}"

    def average(self, array):
        import numpy as np

        tensor = self.torch.from_numpy(array).cuda()
        self.dist.all_reduce(tensor)
        return (tensor / self.size).cpu().numpy().astype(np.float64)

    def finish(self):
        self.dist.barrier()
        self.dist.destroy_process_group()


class Checkpoints:
    """The console's checkpoint contract: save into MA_CHECKPOINT_DIR, resume from MA_RESUME_FROM, and note the
    notice signal (the ranks agree on it at a step, so they all save and end at the same one)."""

    def __init__(self):
        self.folder = os.environ.get("MA_CHECKPOINT_DIR", "")
        self.resume_from = os.environ.get("MA_RESUME_FROM", "")
        self.noticed = False
        name = os.environ.get("MA_CHECKPOINT_SIGNAL", "")
        if name and hasattr(signal, name):
            signal.signal(getattr(signal, name), self.notice)

    def notice(self, _signum, _frame):
        self.noticed = True

    def start(self, weights, rank):
        """(first step, weights): after the checkpoint to resume from, or from the start."""
        import numpy as np

        if not self.resume_from:
            return 1, weights
        saved = np.load(self.resume_from)
        if rank == 0:
            print(f"resumed from {self.resume_from} after step {int(saved['step'])}", flush=True)
        return int(saved["step"]) + 1, saved["weights"]

    def after_step(self, backend, step, weights, every):
        """Save every `every` steps, and at once on the notice; True when the ranks end here (the notice)."""
        import numpy as np

        # Every rank learns of the notice at the same step (any rank's counts).
        noticed = backend.average(np.array([1.0 if self.noticed else 0.0]))[0] > 0
        if backend.rank == 0 and (noticed or step % every == 0):
            self.save(step, weights)
        if noticed:
            print(f"rank {backend.rank} ends at step {step} after the notice", flush=True)
        return noticed

    def save(self, step, weights):
        """Rank 0: the weights, then the manifest naming them (each written aside, then renamed)."""
        import numpy as np

        if not self.folder:
            return
        os.makedirs(self.folder, exist_ok=True)
        name = f"step-{step}.npz"
        with open(os.path.join(self.folder, name + ".tmp"), "wb") as out:
            np.savez(out, step=step, weights=weights)
        os.replace(os.path.join(self.folder, name + ".tmp"), os.path.join(self.folder, name))
        manifest = os.path.join(self.folder, "checkpoint.json")
        with open(manifest + ".tmp", "w") as out:
            json.dump({"step": step, "path": name, "time": datetime.now(UTC).isoformat(timespec="milliseconds")}, out)
        os.replace(manifest + ".tmp", manifest)
        print(f"checkpoint saved at step {step}: {name}", flush=True)


def main():
    import numpy as np

    args, unknown = parse_args()
    torch = torch_with_gpus()
    backend = NcclBackend(torch) if torch is not None else MpiBackend()
    host = socket.gethostname()
    print(f"rank {backend.rank}/{backend.size} on host {host} using {backend.name}", flush=True)
    if backend.rank == 0:
        print("parameters: " + json.dumps(sys.argv[1:]), flush=True)
        if unknown:
            print("unrecognised parameters passed through: " + json.dumps(unknown), flush=True)

    true_weights = np.linspace(-1.0, 1.0, args.features)
    rng = np.random.default_rng(1234 + backend.rank)
    features = rng.normal(size=(args.samples_per_rank, args.features))
    targets = features @ true_weights + rng.normal(scale=0.01, size=args.samples_per_rank)
    weights = np.zeros(args.features)
    checkpoints = Checkpoints()
    first, weights = checkpoints.start(weights, backend.rank)

    for step in range(first, args.steps + 1):
        residual = features @ weights - targets
        local_loss = float(np.mean(residual**2))
        gradient = 2.0 * features.T @ residual / args.samples_per_rank
        averaged = backend.average(np.concatenate([gradient, [local_loss]]))
        weights -= args.lr * averaged[:-1]
        if backend.rank == 0:
            print(f"step={step} loss={averaged[-1]:.6f}", flush=True)
        if checkpoints.after_step(backend, step, weights, args.checkpoint_every):
            backend.finish()
            return
        if args.step_seconds:
            time.sleep(args.step_seconds)

    checksum = float(backend.average(np.array([weights.sum()]))[0])
    print(f"rank {backend.rank} final weights checksum {checksum:.12f}", flush=True)
    if backend.rank == 0 and args.train_url and not args.train_url.startswith(("obs://", "s3://")):
        os.makedirs(args.train_url, exist_ok=True)
        np.save(os.path.join(args.train_url, "weights.npy"), weights)
        print(f"saved weights to {args.train_url}", flush=True)
    backend.finish()


if __name__ == "__main__":
    main()
