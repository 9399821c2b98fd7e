"""A data-parallel training loop for the console's Horovod engine (PyTorch on the CPU).

Every rank fits the same linear model on its own shard of a synthetic data set; hvd.DistributedOptimizer
averages the gradients across ranks at each step (MPI allreduce), and hvd.broadcast_parameters starts
every rank from rank 0's parameters. Each rank prints its host and its loss at each step, and at the
end a checksum of its own final parameters: the ranks must agree.

Run by the platform as:  mpirun ... python train.py [--steps=N --lr=X --fail_rank=R]
"""

import argparse
import json
import os
import socket
import sys
import traceback

import horovod.torch as hvd
import torch


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_url", default="")
    parser.add_argument("--train_url", default="")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--samples_per_rank", type=int, default=256)
    parser.add_argument("--fail_rank", type=int, default=-1, help="this rank raises at the first step (to try failures)")
    known, _ = parser.parse_known_args()
    return known


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    host = socket.gethostname()
    print(f"rank {rank}/{size} on host {host} horovod size={size} local_size={hvd.local_size()} "
          f"cross_size={hvd.cross_size()} mpi={hvd.mpi_enabled()}", flush=True)
    if rank == 0:
        print("parameters: " + json.dumps(sys.argv[1:]), flush=True)

    generator = torch.Generator().manual_seed(1234 + rank)
    true_weights = torch.linspace(-1.0, 1.0, args.features, dtype=torch.float64)
    features = torch.randn(args.samples_per_rank, args.features, generator=generator, dtype=torch.float64)
    targets = features @ true_weights + 0.01 * torch.randn(args.samples_per_rank, generator=generator, dtype=torch.float64)

    torch.manual_seed(rank)  # different starting points on purpose: the broadcast makes them rank 0's
    model = torch.nn.Linear(args.features, 1, dtype=torch.float64)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for step in range(1, args.steps + 1):
        if rank == args.fail_rank:
            raise RuntimeError(f"rank {rank} failed on purpose at step {step}")
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(features).squeeze(1), targets)
        loss.backward()
        optimizer.step()
        average = hvd.allreduce(loss.detach(), name="loss", op=hvd.Average).item()
        print(f"rank {rank} host {host} step={step} loss={loss.item():.6f} average_loss={average:.6f}", flush=True)

    weights = torch.cat([parameter.detach().flatten() for parameter in model.parameters()])
    print(f"rank {rank} final weights checksum {weights.sum().item():.12f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 - any failure: see below
        # Fail fast: end this rank now, before Horovod's exit handler shuts the others down (they would then
        # raise HorovodInternalError themselves, and could be reported before the rank that really failed);
        # mpirun ends the job when it sees this rank's exit status.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
