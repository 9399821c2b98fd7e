"""A data-parallel training loop for the console's MPI engines.

Every rank fits the same linear model on its own shard of a synthetic data set and the gradients
are averaged across ranks each step, as Horovod does. On GPUs with PyTorch present it uses
torch.distributed with NCCL; otherwise mpi4py's allreduce on the CPU.

Run by the platform as:  mpirun ... python train.py --data_url=... --train_url=... [--epochs=N ...]
"""

import argparse
import json
import os
import socket
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_url", default="")
    parser.add_argument("--train_url", default="")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--samples_per_rank", type=int, default=512)
    parser.add_argument("--step_seconds", type=float, default=0.0)
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

    for step in range(1, args.steps + 1):
        residual = features @ weights - targets
        local_loss = float(np.mean(residual**2))
        gradient = 2.0 * features.T @ residual / args.samples_per_rank
        averaged = backend.average(np.concatenate([gradient, [local_loss]]))
        weights -= args.lr * averaged[:-1]
        if backend.rank == 0:
            print(f"step={step} loss={averaged[-1]:.6f}", flush=True)
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
